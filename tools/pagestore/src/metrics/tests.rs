use std::{collections::BTreeSet, time::Duration};

use super::*;
use pagestore_protocol::jobs::JobState;
use pagestore_testkit::openmetrics::parse;

/// A snapshot with every family populated: two shards, a rule with a quota and one without,
/// a job, and etcd.
fn full() -> Snapshot {
    let mut shard = ShardMetrics {
        epoch: 3,
        ..ShardMetrics::default()
    };
    shard.engine.hits = 30;
    shard.engine.misses = 10;
    shard.engine.hit_bytes = 300;
    shard.loader.ufs_bytes = 100;
    shard.latency_buckets[0] = 5; // <= 50 us
    shard.latency_buckets[3] = 2; // (250, 500] us
    shard.latency_buckets[LATENCY_BOUNDS_US.len()] = 1; // > 5 s
    shard.latency_sum_us = 6_001_000;
    shard.requests = 8;
    shard.memory.hits = 4;
    shard.memory.bytes = 1 << 20;
    shard.memory.capacity = 2 << 20;
    shard.memory_hit_bytes = 400;
    shard.served_bytes = 700;
    shard.mounts = vec![pagestore_protocol::frame::MountBytes {
        prefix: "/data".into(),
        usd_per_tb: 90.0,
        cache_bytes: 5_000_000_000_000,
        store_bytes: 1_000_000_000_000,
    }];
    let rule = |prefix: &str, quota, ttl| Rule {
        prefix: prefix.into(),
        quota,
        ttl,
        pin: false,
    };
    let stats = RuleStats {
        pages: 2,
        bytes: 300,
        ..RuleStats::default()
    };
    let job = JobRecord {
        id: "job \"one\"".into(),
        state: JobState::Running,
        files_total: 7,
        ..JobRecord::default()
    };
    Snapshot {
        node: "n1".into(),
        shards: vec![shard.clone(), shard],
        ring_nodes: 3,
        ring_nodes_down: 1,
        etcd_reachable: Some(true),
        jobs: vec![(job, "running")],
        rules: vec![
            (rule("/a\"b", Some(1 << 20), None), stats),
            (
                rule("/c", None, Some(Duration::from_secs(30))),
                RuleStats::default(),
            ),
        ],
        writeback: Some(crate::writeback::WriteBackMetrics {
            records: 4,
            summary: pagestore_protocol::frame::WriteBackSummary {
                files_dirty: 2,
                bytes_dirty: 5 << 20,
                oldest_dirty_ms: 1500,
                ..Default::default()
            },
            flushed_bytes: 9,
            clock_lead_ms: 2500,
            ..Default::default()
        }),
    }
}

#[test]
fn every_family_renders_as_valid_openmetrics() {
    let text = render(full());
    let m = parse(&text);
    let get = |name: &str, labels: &str| m[&(name.to_string(), labels.to_string())];
    assert_eq!(get("pagestore_hits_total", "node=\"n1\",shard=\"1\""), 30.0);
    assert_eq!(get("pagestore_ring_epoch", "node=\"n1\",shard=\"0\""), 3.0);
    // Memory-tier hits count as hits: (30 + 4) / (30 + 4 + 10), (300 + 400) / (700 + 100).
    assert_eq!(get("pagestore_hit_ratio", "node=\"n1\""), 34.0 / 44.0);
    assert_eq!(get("pagestore_byte_hit_ratio", "node=\"n1\""), 0.875);
    assert_eq!(
        get("pagestore_memory_hits_total", "node=\"n1\",shard=\"0\""),
        4.0
    );
    // Mounts are summed over the shards and priced: 10 TB kept off the store at $90 per TB.
    let mount = "node=\"n1\",mount=\"/data\"";
    assert_eq!(get("pagestore_mount_cache_bytes_total", mount), 1e13);
    assert_eq!(get("pagestore_mount_store_bytes_total", mount), 2e12);
    assert_eq!(get("pagestore_mount_egress_usd_per_tb", mount), 90.0);
    assert_eq!(get("pagestore_mount_egress_saved_usd", mount), 900.0);
    assert_eq!(get("pagestore_etcd_reachable", "node=\"n1\""), 1.0);
    assert_eq!(get("pagestore_writeback_dirty_files", "node=\"n1\""), 2.0);
    assert_eq!(
        get("pagestore_writeback_flush_lag_seconds", "node=\"n1\""),
        1.5
    );
    assert_eq!(
        get("pagestore_writeback_flushed_bytes_total", "node=\"n1\""),
        9.0
    );
    assert_eq!(
        get("pagestore_writeback_clock_lead_seconds", "node=\"n1\""),
        2.5
    );
    assert_eq!(get("pagestore_ring_nodes_down", "node=\"n1\""), 1.0);
    assert_eq!(
        get("pagestore_load_jobs", "node=\"n1\",state=\"running\""),
        1.0
    );
    assert_eq!(
        get("pagestore_load_jobs", "node=\"n1\",state=\"lost\""),
        0.0
    );
    assert_eq!(
        get(
            "pagestore_load_job_files_total",
            "node=\"n1\",job=\"job \\\"one\\\"\",state=\"running\""
        ),
        7.0
    );
    // Rule labels are escaped; a rule without a quota has no quota series.
    assert_eq!(
        get("pagestore_rule_pages", "node=\"n1\",rule=\"/a\\\"b\""),
        2.0
    );
    assert_eq!(
        get("pagestore_rule_quota_bytes", "node=\"n1\",rule=\"/a\\\"b\""),
        1048576.0
    );
    assert!(!m.contains_key(&(
        "pagestore_rule_quota_bytes".to_string(),
        "node=\"n1\",rule=\"/c\"".to_string()
    )));
    assert_eq!(
        get("pagestore_rule_ttl_seconds", "node=\"n1\",rule=\"/c\""),
        30.0
    );
    assert!(
        !text.contains("pagestore_rule_ttl_seconds{node=\"n1\",rule=\"/a"),
        "{text}"
    );
    // The histogram's buckets are cumulative and end with +Inf = count.
    let bucket = |le: &str| {
        get(
            "pagestore_request_latency_microseconds_bucket",
            &format!("le=\"{le}\",node=\"n1\",shard=\"0\""),
        )
    };
    assert_eq!(bucket("50.0"), 5.0);
    assert_eq!(bucket("250.0"), 5.0);
    assert_eq!(bucket("500.0"), 7.0);
    assert_eq!(bucket("5000000.0"), 7.0);
    assert_eq!(bucket("+Inf"), 8.0);
    let count = get(
        "pagestore_request_latency_microseconds_count",
        "node=\"n1\",shard=\"0\"",
    );
    assert_eq!(count, 8.0);
}

#[test]
fn a_node_without_rules_jobs_or_etcd_leaves_those_series_out() {
    let mut s = full();
    (s.rules, s.jobs, s.etcd_reachable) = (Vec::new(), Vec::new(), None);
    let text = render(s);
    parse(&text);
    assert!(!text.contains("pagestore_rule_"), "{text}");
    assert!(!text.contains("pagestore_etcd_reachable"), "{text}");
    assert!(!text.contains("pagestore_load_job_files_total{"), "{text}");
    assert!(
        text.contains("pagestore_load_jobs{node=\"n1\",state=\"done\"} 0"),
        "{text}"
    );
}

/// The metric names docs/OPERATIONS.md mentions: backticked `pagestore_...` words that are
/// not Rust paths or wildcards (`{labels}` after a name are dropped).
fn documented() -> BTreeSet<String> {
    let doc = include_str!("../../../../docs/OPERATIONS.md");
    doc.split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| w.starts_with("pagestore_") && !w.contains("::") && !w.ends_with('*'))
        .map(|w| w.split('{').next().unwrap_or(w).to_string())
        .collect()
}

#[test]
fn every_documented_metric_is_exported_and_every_exported_one_documented() {
    let text = render(full());
    let samples: BTreeSet<String> = parse(&text).into_keys().map(|(name, _)| name).collect();
    let exported: BTreeSet<String> = names().iter().map(|n| n.to_string()).collect();
    let documented = documented();
    assert!(documented.len() >= 40, "{documented:?}");
    for name in &documented {
        assert!(
            exported.contains(name),
            "docs/OPERATIONS.md names {name}, which is not exported"
        );
        let histogram = format!("{name}_count");
        assert!(
            samples.contains(name) || samples.contains(&histogram),
            "{name} has no sample in a full snapshot:\n{text}"
        );
    }
    for name in &exported {
        assert!(
            documented.contains(name),
            "{name} is exported but not in docs/OPERATIONS.md"
        );
    }
}
