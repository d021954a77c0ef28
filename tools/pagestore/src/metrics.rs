//! `/metrics`: one snapshot of a node rendered in the OpenMetrics text format by
//! prometheus-client. The tables in this module are the one place where metric names, types and
//! help texts live; docs/OPERATIONS.md lists the same names, and a test checks that every name
//! it documents is exported.
//!
//! Counters are named here with their `_total` suffix, as they appear in samples; the
//! OpenMetrics family (the `# TYPE` line) drops it.

use std::fmt;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
    registry::Registry,
};

use pagestore_engine::{Rule, RuleStats};
use pagestore_protocol::jobs::JobRecord;
use pagestore_server::node::{ShardMetrics, LATENCY_BOUNDS_US};

/// The `Content-Type` of [`render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What `/metrics` reports, read once per scrape.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The node's UUID.
    pub node: String,
    /// Each shard's numbers, by shard index.
    pub shards: Vec<ShardMetrics>,
    /// Nodes holding ring slots in the node's view.
    pub ring_nodes: u64,
    /// Ring nodes known to be down.
    pub ring_nodes_down: u64,
    /// With etcd: whether its last request was answered.
    pub etcd_reachable: Option<bool>,
    /// Preload job records with their state as shown (`running`, `done`, `failed`, `lost`).
    pub jobs: Vec<(JobRecord, &'static str)>,
    /// Each cache rule with its accounting summed over the shards.
    pub rules: Vec<(Rule, RuleStats)>,
    /// The write-back side's numbers.
    pub writeback: Option<crate::writeback::WriteBackMetrics>,
}

/// Counter or gauge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic; the name ends in `_total`.
    Counter,
    /// Goes up and down.
    Gauge,
}

/// One per-shard family: name, kind, help, value.
type ShardFamily = (&'static str, Kind, &'static str, fn(&ShardMetrics) -> u64);

/// The per-shard families (labels `node`, `shard`).
const PER_SHARD: &[ShardFamily] = &[
    (
        "pagestore_hits_total",
        Kind::Counter,
        "Page reads served from the cache.",
        |s| s.engine.hits,
    ),
    (
        "pagestore_misses_total",
        Kind::Counter,
        "Page reads not in the cache.",
        |s| s.engine.misses,
    ),
    (
        "pagestore_hit_bytes_total",
        Kind::Counter,
        "Bytes served from the cache.",
        |s| s.engine.hit_bytes,
    ),
    (
        "pagestore_ufs_bytes_total",
        Kind::Counter,
        "Bytes read from the under storage (misses and preloads).",
        |s| s.loader.ufs_bytes,
    ),
    (
        "pagestore_ufs_reads_total",
        Kind::Counter,
        "Page loads sent to the under storage.",
        |s| s.loader.ufs_reads,
    ),
    (
        "pagestore_ufs_errors_total",
        Kind::Counter,
        "Under-storage requests that failed.",
        |s| s.loader.ufs_errors,
    ),
    (
        "pagestore_store_failures_total",
        Kind::Counter,
        "Loaded pages served but not kept (cache or rule quota full, or a disk error).",
        |s| s.loader.store_failures,
    ),
    (
        "pagestore_coalesced_misses_total",
        Kind::Counter,
        "Misses that joined a load already in flight.",
        |s| s.loader.coalesced,
    ),
    (
        "pagestore_ufs_repeat_reads_total",
        Kind::Counter,
        "Page loads of a page the shard had loaded recently already (a second store read of one \
         page; among its last 65,536 loads).",
        |s| s.loader.ufs_repeat_reads,
    ),
    (
        "pagestore_served_bytes_total",
        Kind::Counter,
        "Page bytes sent to clients, from memory, disk or the under storage.",
        |s| s.served_bytes,
    ),
    (
        "pagestore_memory_hits_total",
        Kind::Counter,
        "Reads served from the memory tier (no disk read).",
        |s| s.memory.hits,
    ),
    (
        "pagestore_memory_hit_bytes_total",
        Kind::Counter,
        "Bytes sent from the memory tier.",
        |s| s.memory_hit_bytes,
    ),
    (
        "pagestore_memory_bytes",
        Kind::Gauge,
        "Bytes the memory tier holds.",
        |s| s.memory.bytes,
    ),
    (
        "pagestore_memory_capacity_bytes",
        Kind::Gauge,
        "The memory tier's capacity on the shard (--memory-cache / shards; 0: off).",
        |s| s.memory.capacity,
    ),
    (
        "pagestore_memory_admissions_total",
        Kind::Counter,
        "Pages admitted into the memory tier.",
        |s| s.memory.admissions,
    ),
    (
        "pagestore_memory_evictions_total",
        Kind::Counter,
        "Pages evicted from the memory tier.",
        |s| s.memory.evictions,
    ),
    (
        "pagestore_hot_pages",
        Kind::Gauge,
        "Pages the shard owns that are hot now: readers spread them over their replicas.",
        |s| s.hot_now,
    ),
    (
        "pagestore_hot_pages_turned_total",
        Kind::Counter,
        "Pages the shard owns that turned hot (read faster than --hot-threshold).",
        |s| s.hot_turned,
    ),
    (
        "pagestore_replica_copies_total",
        Kind::Counter,
        "Other owners' hot pages the shard copied from their owner (peer to peer).",
        |s| s.loader.owner_copies,
    ),
    (
        "pagestore_replica_copy_failures_total",
        Kind::Counter,
        "Hot-page copies the owner could not give (the reader asked the owner itself).",
        |s| s.loader.owner_copy_failures,
    ),
    (
        "pagestore_replicas",
        Kind::Gauge,
        "Copies of other owners' hot pages the shard holds.",
        |s| u64::from(s.replicas.held),
    ),
    (
        "pagestore_replicas_dropped_total",
        Kind::Counter,
        "Copies of hot pages dropped because nobody read them for --hot-cool.",
        |s| s.replicas.dropped,
    ),
    (
        "pagestore_replica_hot_reads_total",
        Kind::Counter,
        "Reads the shard served as a hot page's replica.",
        |s| s.replicas.reads,
    ),
    (
        "pagestore_metadata_cache_hits_total",
        Kind::Counter,
        "Path metadata and listings answered from the TTL cache.",
        |s| s.loader.metadata_hits,
    ),
    (
        "pagestore_metadata_cache_misses_total",
        Kind::Counter,
        "Path metadata and listings fetched from the under storage.",
        |s| s.loader.metadata_misses,
    ),
    (
        "pagestore_metadata_dir_listings_total",
        Kind::Counter,
        "Directories listed to answer the stats of their files (after 16 stats of one \
         directory within the metadata TTL).",
        |s| s.loader.dir_listings,
    ),
    (
        "pagestore_requests_total",
        Kind::Counter,
        "Requests served by the shard's QUIC endpoint.",
        |s| s.requests,
    ),
    (
        "pagestore_inserts_total",
        Kind::Counter,
        "Pages written.",
        |s| s.engine.inserts,
    ),
    (
        "pagestore_insert_bytes_total",
        Kind::Counter,
        "Bytes written.",
        |s| s.engine.insert_bytes,
    ),
    (
        "pagestore_evictions_total",
        Kind::Counter,
        "Pages evicted.",
        |s| s.engine.evictions,
    ),
    (
        "pagestore_checksum_failures_total",
        Kind::Counter,
        "Pages whose data failed its checksum (dropped, never served).",
        |s| s.engine.checksum_failures,
    ),
    (
        "pagestore_io_errors_total",
        Kind::Counter,
        "Disk errors.",
        |s| s.engine.io_errors,
    ),
    (
        "pagestore_capacity_bytes",
        Kind::Gauge,
        "Cache capacity.",
        |s| s.engine.capacity_bytes,
    ),
    ("pagestore_used_bytes", Kind::Gauge, "Bytes cached.", |s| {
        s.engine.bytes
    }),
    (
        "pagestore_free_bytes",
        Kind::Gauge,
        "Capacity not holding pages.",
        |s| s.engine.capacity_bytes.saturating_sub(s.engine.bytes),
    ),
    ("pagestore_pages", Kind::Gauge, "Pages cached.", |s| {
        s.engine.pages
    }),
    (
        "pagestore_ring_epoch",
        Kind::Gauge,
        "Ring epoch the shard serves under.",
        |s| s.epoch,
    ),
    (
        "pagestore_replica_reads_total",
        Kind::Counter,
        "Reads served as a replica because a client's owner failed (fallbacks seen by nodes; \
         clients count theirs).",
        |s| s.replica_reads,
    ),
    (
        "pagestore_not_owner_total",
        Kind::Counter,
        "Requests answered NotOwner (a client routed with another ring; it falls back).",
        |s| s.not_owner,
    ),
    (
        "pagestore_forbidden_total",
        Kind::Counter,
        "Requests refused because the peer's certificate role does not allow them \
         (docs/SECURITY.md).",
        |s| s.forbidden,
    ),
    (
        "pagestore_shard_dirty_bytes",
        Kind::Gauge,
        "Bytes of dirty pages (written through the cluster, not flushed yet; never evicted).",
        |s| s.engine.dirty_bytes,
    ),
    (
        "pagestore_shard_dirty_limit_bytes",
        Kind::Gauge,
        "The most bytes of dirty pages the shard takes (--dirty-limit over the shards).",
        |s| s.engine.dirty_limit,
    ),
    (
        "pagestore_dirty_puts_total",
        Kind::Counter,
        "Dirty pages stored, each durable before it was acknowledged.",
        |s| s.engine.dirty_puts,
    ),
    (
        "pagestore_dirty_refused_total",
        Kind::Counter,
        "Dirty pages refused at the dirty limit (the writer waits and tries again).",
        |s| s.engine.dirty_refused,
    ),
    (
        "pagestore_dirty_syncs_total",
        Kind::Counter,
        "fdatasync calls that made dirty pages durable (one serves every page written before it).",
        |s| s.engine.syncs,
    ),
    (
        "pagestore_connections_total",
        Kind::Counter,
        "QUIC connections accepted.",
        |s| s.endpoint.connections,
    ),
    (
        "pagestore_connections_refused_total",
        Kind::Counter,
        "QUIC connection attempts refused by the connection or handshake limits.",
        |s| s.endpoint.refused,
    ),
    (
        "pagestore_quic_retries_total",
        Kind::Counter,
        "QUIC Retry packets sent to validate client addresses under load.",
        |s| s.endpoint.retries,
    ),
    (
        "pagestore_requests_stalled_total",
        Kind::Counter,
        "Requests reset because their bytes stopped arriving, and replies reset because the \
         client stopped taking them (--request-stall-timeout).",
        |s| s.endpoint.stalled,
    ),
    (
        "pagestore_request_budget_waits_total",
        Kind::Counter,
        "Times a request waited for the node's request or reply budget (--max-partial-bytes).",
        |s| s.endpoint.budget_waits,
    ),
    (
        "pagestore_requests_rejected_total",
        Kind::Counter,
        "Request streams reset because the request was too large or malformed.",
        |s| s.endpoint.rejected,
    ),
    (
        "pagestore_payloads_apart_total",
        Kind::Counter,
        "Request payloads of 64 KiB up to a page (written pages, and large batches of \
         replicated records) received straight into memory aligned for the disk: a written \
         page is not copied again before the write.",
        |s| s.endpoint.payloads_apart,
    ),
];

/// One node-wide write-back family: name, kind, help, value (label `node`).
type WriteBackFamily = (
    &'static str,
    Kind,
    &'static str,
    fn(&crate::writeback::WriteBackMetrics) -> u64,
);

const WRITE_BACK: &[WriteBackFamily] = &[
    (
        "pagestore_writeback_dirty_files",
        Kind::Gauge,
        "Files written through the cluster and not in the under storage yet (open or closed).",
        |w| w.summary.files_dirty,
    ),
    (
        "pagestore_writeback_dirty_bytes",
        Kind::Gauge,
        "Bytes of those files.",
        |w| w.summary.bytes_dirty,
    ),
    (
        "pagestore_writeback_deletes_pending",
        Kind::Gauge,
        "Deletions and renames not applied to the under storage yet.",
        |w| w.summary.deletes_pending,
    ),
    (
        "pagestore_writeback_flushing",
        Kind::Gauge,
        "Files this node is flushing now.",
        |w| w.summary.files_flushing,
    ),
    (
        "pagestore_writeback_records",
        Kind::Gauge,
        "Write-back records this node keeps (files, directories, deletions).",
        |w| w.records,
    ),
    (
        "pagestore_writeback_journal_bytes",
        Kind::Gauge,
        "Bytes of the write-back journal.",
        |w| w.journal_bytes,
    ),
    (
        "pagestore_writeback_flushed_files_total",
        Kind::Counter,
        "Files this node flushed to the under storage.",
        |w| w.flushed_files,
    ),
    (
        "pagestore_writeback_flushed_bytes_total",
        Kind::Counter,
        "Bytes this node flushed to the under storage.",
        |w| w.flushed_bytes,
    ),
    (
        "pagestore_writeback_deletes_applied_total",
        Kind::Counter,
        "Deletions this node applied to the under storage.",
        |w| w.deletes,
    ),
    (
        "pagestore_writeback_flush_errors_total",
        Kind::Counter,
        "Flush attempts that failed (each is retried, 1 s doubling to 10 s).",
        |w| w.errors,
    ),
    (
        "pagestore_writeback_seals_total",
        Kind::Counter,
        "Open files sealed and flushed because their writer went silent for --write-lease.",
        |w| w.seals,
    ),
    (
        "pagestore_writeback_orphans_dropped_total",
        Kind::Counter,
        "Dirty pages dropped because no record holds them (a writer that never committed).",
        |w| w.orphans_dropped,
    ),
    (
        "pagestore_writeback_pages_retired_total",
        Kind::Counter,
        "Cached pages of versions replaced or deleted, demoted: evicted before any other page.",
        |w| w.pages_retired,
    ),
    (
        "pagestore_writeback_records_forgotten_total",
        Kind::Counter,
        "Records forgotten --write-records-keep after their change: files flushed, deletions applied.",
        |w| w.forgotten,
    ),
    (
        "pagestore_writeback_records_caught_up_total",
        Kind::Counter,
        "Records of a path this node had missed and took from its peers before judging a change of it or answering a stat of it.",
        |w| w.caught_up,
    ),
    (
        "pagestore_writeback_listings_same_total",
        Kind::Counter,
        "Peers' requests for this node's records of a directory's entries (before they list it) answered that it holds what they hold: nothing sent.",
        |w| w.listings_same,
    ),
    (
        "pagestore_writeback_confirm_rounds_total",
        Kind::Counter,
        "Round trips this node spent asking its peers of its live records beneath directories they did not show them under (deletions it may have missed), before a listing, a stat or a change.",
        |w| w.confirm_rounds,
    ),
    (
        "pagestore_writeback_pulls_total",
        Kind::Counter,
        "Pulls of the peers' records finished (at start, every peer at once, each asked for up to 15 s; then one peer every 30 s).",
        |w| w.pulls,
    ),
    (
        "pagestore_writeback_records_pulled_total",
        Kind::Counter,
        "Records those pulls took from the peers (ranking above what this node held).",
        |w| w.pulled,
    ),
    (
        "pagestore_writeback_records_limit",
        Kind::Gauge,
        "Records past which changes that add a path are refused (--write-records-max).",
        |w| w.records_limit,
    ),
];

const FLUSH_LAG: (&str, &str) = (
    "pagestore_writeback_flush_lag_seconds",
    "Age of the oldest change not in the under storage yet (0: none).",
);
const CLOCK_LEAD: (&str, &str) = (
    "pagestore_writeback_clock_lead_seconds",
    "How far ahead of this node's wall clock its change stamps run: the lead of the fastest \
     node clock it has seen (0: none faster; over a second, check the nodes' time sync).",
);

/// The request service-time histogram (labels `node`, `shard`).
const LATENCY: (&str, &str) = (
    "pagestore_request_latency_microseconds",
    "Request service time on the shard, microseconds, since the node started.",
);

/// The node-wide ratios (label `node`).
const HIT_RATIO: (&str, &str) = (
    "pagestore_hit_ratio",
    "Hits / (hits + misses) since the node started.",
);
const BYTE_HIT_RATIO: (&str, &str) = (
    "pagestore_byte_hit_ratio",
    "Bytes from the cache / (bytes from the cache + bytes from the under storage).",
);

/// Per-mount families (labels `node`, `mount`), summed over the shards.
const MOUNT_CACHE_BYTES: (&str, &str) = (
    "pagestore_mount_cache_bytes_total",
    "Bytes of the mount served without a store read of their own (memory, disk, or a load \
     another request started): egress kept off the store.",
);
const MOUNT_STORE_BYTES: (&str, &str) = (
    "pagestore_mount_store_bytes_total",
    "Bytes of the mount read from the under storage (misses and preloads).",
);
const MOUNT_PRICE: (&str, &str) = (
    "pagestore_mount_egress_usd_per_tb",
    "The egress price of the mount's store, US dollars per TB (the mount URL's \
     egress_usd_per_tb; 0: not priced).",
);
const MOUNT_SAVED: (&str, &str) = (
    "pagestore_mount_egress_saved_usd",
    "Egress kept off the store since the node started, priced: cache bytes / 1e12 x the price.",
);

/// Membership gauges (label `node`).
const RING_NODES: (&str, &str) = (
    "pagestore_ring_nodes",
    "Nodes holding ring slots in this node's view.",
);
const RING_NODES_DOWN: (&str, &str) = (
    "pagestore_ring_nodes_down",
    "Ring nodes known to be down (static ring mode); their keys are read from the under storage.",
);
const ETCD_REACHABLE: (&str, &str) = (
    "pagestore_etcd_reachable",
    "1 when the last request to etcd was answered.",
);

/// Preload jobs by state (labels `node`, `state`).
const LOAD_JOBS: (&str, &str) = (
    "pagestore_load_jobs",
    "Preload jobs reported to this node, by state (running, done, failed, lost: no report for \
     30 s).",
);

/// The job states [`LOAD_JOBS`] counts.
const JOB_STATES: [&str; 4] = ["running", "done", "failed", "lost"];

/// One per-job gauge: name, help, value (labels `node`, `job`, `state`).
type JobFamily = (&'static str, &'static str, fn(&JobRecord) -> u64);

const PER_JOB: &[JobFamily] = &[
    ("pagestore_load_job_files_total", "Files in the job.", |r| {
        r.files_total
    }),
    (
        "pagestore_load_job_files_done",
        "Files the job has finished (loaded or failed).",
        |r| r.files_done,
    ),
    (
        "pagestore_load_job_files_failed",
        "Files that failed.",
        |r| r.files_failed,
    ),
    (
        "pagestore_load_job_bytes_done",
        "Bytes of the finished files.",
        |r| r.bytes_done,
    ),
    (
        "pagestore_load_job_bytes_loaded",
        "Bytes the job loaded from the under storage.",
        |r| r.bytes_loaded,
    ),
];

/// One per-rule family: name, kind, help, value (`None`: no series for that rule). Labels
/// `node`, `rule`; node-wide sums over the shards.
type RuleFamily = (
    &'static str,
    Kind,
    &'static str,
    fn(&Rule, &RuleStats) -> Option<u64>,
);

const PER_RULE: &[RuleFamily] = &[
    (
        "pagestore_rule_pages",
        Kind::Gauge,
        "Pages cached under the rule.",
        |_, s| Some(s.pages),
    ),
    (
        "pagestore_rule_bytes",
        Kind::Gauge,
        "Bytes cached under the rule (page lengths).",
        |_, s| Some(s.bytes),
    ),
    (
        "pagestore_rule_pinned_bytes",
        Kind::Gauge,
        "Bytes of the rule's pages that are pinned (by the rule or by request).",
        |_, s| Some(s.pinned_bytes),
    ),
    (
        "pagestore_rule_quota_bytes",
        Kind::Gauge,
        "The rule's quota on this node (each shard enforces quota/shards in whole pages).",
        |r, _| r.quota,
    ),
    (
        "pagestore_rule_ttl_seconds",
        Kind::Gauge,
        "The rule's TTL: older pages are never served.",
        |r, _| r.ttl.map(|t| t.as_secs()),
    ),
    (
        "pagestore_rule_inserts_total",
        Kind::Counter,
        "Pages stored under the rule.",
        |_, s| Some(s.inserts),
    ),
    (
        "pagestore_rule_evictions_total",
        Kind::Counter,
        "Pages of the rule evicted by the eviction policy (cache full).",
        |_, s| Some(s.evictions),
    ),
    (
        "pagestore_rule_quota_evictions_total",
        Kind::Counter,
        "Pages of the rule evicted to keep it within its quota.",
        |_, s| Some(s.quota_evictions),
    ),
    (
        "pagestore_rule_quota_refusals_total",
        Kind::Counter,
        "Pages not stored: the rule was at its quota and none of its pages could be evicted.",
        |_, s| Some(s.quota_refusals),
    ),
    (
        "pagestore_rule_expirations_total",
        Kind::Counter,
        "Pages found past the rule's TTL on lookup (dropped, read again from the under storage).",
        |_, s| Some(s.expirations),
    ),
    (
        "pagestore_rule_pins_refused_total",
        Kind::Counter,
        "Pages of a pin rule stored unpinned because 90% of a shard's slots were pinned.",
        |_, s| Some(s.pins_refused),
    ),
];

/// Every metric name `/metrics` can export (the histogram's samples add `_bucket`, `_sum` and
/// `_count`).
pub fn names() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = PER_SHARD.iter().map(|f| f.0).collect();
    v.extend([LATENCY.0, HIT_RATIO.0, BYTE_HIT_RATIO.0]);
    v.extend([
        MOUNT_CACHE_BYTES.0,
        MOUNT_STORE_BYTES.0,
        MOUNT_PRICE.0,
        MOUNT_SAVED.0,
    ]);
    v.extend([
        RING_NODES.0,
        RING_NODES_DOWN.0,
        ETCD_REACHABLE.0,
        LOAD_JOBS.0,
    ]);
    v.extend(PER_JOB.iter().map(|f| f.0));
    v.extend(PER_RULE.iter().map(|f| f.0));
    v.extend(WRITE_BACK.iter().map(|f| f.0));
    v.extend([FLUSH_LAG.0, CLOCK_LEAD.0]);
    v
}

/// The snapshot in the OpenMetrics text format (ends with `# EOF`).
pub fn render(snapshot: Snapshot) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(snapshot));
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
        // Writing into a String does not fail; say so if it ever does instead of serving half.
        return format!("# metrics could not be encoded: {e}\n# EOF\n");
    }
    out
}

/// A label value with backslash, double quote and newline escaped (prometheus-client writes
/// label values as given).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

type Labels = Vec<(&'static str, String)>;

/// One family of integer samples.
fn family(
    e: &mut DescriptorEncoder,
    name: &str,
    kind: Kind,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, u64)>,
) -> fmt::Result {
    let (name, ty) = match kind {
        Kind::Counter => (
            name.strip_suffix("_total").unwrap_or(name),
            MetricType::Counter,
        ),
        Kind::Gauge => (name, MetricType::Gauge),
    };
    let mut m = e.encode_descriptor(name, help, None, ty)?;
    for (labels, v) in samples {
        let mut f = m.encode_family(&labels)?;
        match kind {
            Kind::Counter => f.encode_counter::<NoLabelSet, u64, u64>(&v, None)?,
            Kind::Gauge => f.encode_gauge(&v)?,
        }
    }
    Ok(())
}

/// One node-wide gauge of any numeric value.
fn node_gauge(
    e: &mut DescriptorEncoder,
    (name, help): (&str, &str),
    node: &str,
    v: f64,
) -> fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    m.encode_family(&vec![("node", label(node))])?
        .encode_gauge(&v)
}

impl Snapshot {
    fn node_labels(&self) -> Labels {
        vec![("node", label(&self.node))]
    }

    fn shard_labels(&self, shard: usize) -> Labels {
        vec![("node", label(&self.node)), ("shard", shard.to_string())]
    }

    fn encode_shards(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        for (name, kind, help, value) in PER_SHARD {
            let samples = self.shards.iter().enumerate();
            family(
                e,
                name,
                *kind,
                help,
                samples.map(|(i, s)| (self.shard_labels(i), value(s))),
            )?;
        }
        let mut m = e.encode_descriptor(LATENCY.0, LATENCY.1, None, MetricType::Histogram)?;
        for (i, s) in self.shards.iter().enumerate() {
            let labels = self.shard_labels(i);
            let bounds = LATENCY_BOUNDS_US
                .iter()
                .map(|&b| b as f64)
                .chain([f64::MAX]);
            let buckets: Vec<(f64, u64)> = bounds.zip(s.latency_buckets).collect();
            let count = s.latency_buckets.iter().sum();
            m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
                s.latency_sum_us as f64,
                count,
                &buckets,
                None,
            )?;
        }
        // Node-wide ratios: the first of the three numbers operators judge a cache by.
        let sum = |f: fn(&ShardMetrics) -> u64| self.shards.iter().map(f).sum::<u64>() as f64;
        let ratio = |a: f64, b: f64| if a + b > 0.0 { a / (a + b) } else { 0.0 };
        // Memory-tier hits are hits too (they never reach the engine).
        let hits = sum(|s| s.engine.hits + s.memory.hits);
        let misses = sum(|s| s.engine.misses);
        let hit_bytes = sum(|s| s.engine.hit_bytes + s.memory_hit_bytes);
        let ufs_bytes = sum(|s| s.loader.ufs_bytes);
        node_gauge(e, HIT_RATIO, &self.node, ratio(hits, misses))?;
        node_gauge(e, BYTE_HIT_RATIO, &self.node, ratio(hit_bytes, ufs_bytes))
    }

    /// Each mount's bytes and price, summed over the shards (first seen order).
    fn mounts(&self) -> Vec<pagestore_protocol::frame::MountBytes> {
        let mut out: Vec<pagestore_protocol::frame::MountBytes> = Vec::new();
        for m in self.shards.iter().flat_map(|s| &s.mounts) {
            match out.iter_mut().find(|o| o.prefix == m.prefix) {
                Some(o) => {
                    o.cache_bytes = o.cache_bytes.saturating_add(m.cache_bytes);
                    o.store_bytes = o.store_bytes.saturating_add(m.store_bytes);
                }
                None => out.push(m.clone()),
            }
        }
        out
    }

    fn encode_mounts(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let mounts = self.mounts();
        if mounts.is_empty() {
            return Ok(());
        }
        type M = pagestore_protocol::frame::MountBytes;
        let labels = |m: &M| {
            let mut l = self.node_labels();
            l.push(("mount", label(&m.prefix)));
            l
        };
        for ((name, help), value) in [
            (MOUNT_CACHE_BYTES, (|m| m.cache_bytes) as fn(&M) -> u64),
            (MOUNT_STORE_BYTES, |m| m.store_bytes),
        ] {
            let samples = mounts.iter().map(|m| (labels(m), value(m)));
            family(e, name, Kind::Counter, help, samples)?;
        }
        for ((name, help), value) in [
            (MOUNT_PRICE, (|m| m.usd_per_tb) as fn(&M) -> f64),
            (MOUNT_SAVED, |m| m.cache_bytes as f64 / 1e12 * m.usd_per_tb),
        ] {
            let mut f = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for m in &mounts {
                f.encode_family(&labels(m))?.encode_gauge(&value(m))?;
            }
        }
        Ok(())
    }

    fn encode_membership(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let node = self.node_labels();
        let (name, help) = RING_NODES;
        family(
            e,
            name,
            Kind::Gauge,
            help,
            [(node.clone(), self.ring_nodes)],
        )?;
        let (name, help) = RING_NODES_DOWN;
        family(
            e,
            name,
            Kind::Gauge,
            help,
            [(node.clone(), self.ring_nodes_down)],
        )?;
        if let Some(up) = self.etcd_reachable {
            let (name, help) = ETCD_REACHABLE;
            family(e, name, Kind::Gauge, help, [(node, u64::from(up))])?;
        }
        Ok(())
    }

    fn encode_jobs(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let by_state = JOB_STATES.iter().map(|st| {
            let n = self.jobs.iter().filter(|(_, s)| s == st).count() as u64;
            let mut labels = self.node_labels();
            labels.push(("state", (*st).to_string()));
            (labels, n)
        });
        family(e, LOAD_JOBS.0, Kind::Gauge, LOAD_JOBS.1, by_state)?;
        for (name, help, value) in PER_JOB {
            let samples = self.jobs.iter().map(|(r, state)| {
                let mut labels = self.node_labels();
                labels.push(("job", label(&r.id)));
                labels.push(("state", (*state).to_string()));
                (labels, value(r))
            });
            family(e, name, Kind::Gauge, help, samples)?;
        }
        Ok(())
    }

    fn encode_rules(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        if self.rules.is_empty() {
            return Ok(());
        }
        for (name, kind, help, value) in PER_RULE {
            let samples = self.rules.iter().filter_map(|(r, s)| {
                let mut labels = self.node_labels();
                labels.push(("rule", label(&r.prefix)));
                value(r, s).map(|v| (labels, v))
            });
            family(e, name, *kind, help, samples)?;
        }
        Ok(())
    }
}

impl Snapshot {
    fn encode_writeback(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let Some(w) = &self.writeback else {
            return Ok(());
        };
        for (name, kind, help, value) in WRITE_BACK {
            family(e, name, *kind, help, [(self.node_labels(), value(w))])?;
        }
        node_gauge(
            e,
            FLUSH_LAG,
            &self.node,
            w.summary.oldest_dirty_ms as f64 / 1e3,
        )?;
        node_gauge(e, CLOCK_LEAD, &self.node, w.clock_lead_ms as f64 / 1e3)
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        self.encode_shards(&mut e)?;
        self.encode_mounts(&mut e)?;
        self.encode_membership(&mut e)?;
        self.encode_jobs(&mut e)?;
        self.encode_rules(&mut e)?;
        self.encode_writeback(&mut e)
    }
}

#[cfg(test)]
mod tests;
