//! The node's admin HTTP endpoint (on the tokio side): `/health`, `/metrics` (Prometheus text
//! format), `/v1/ring` and `/v1/rules` (JSON).

use std::{convert::Infallible, fmt::Write as _, net::SocketAddr, sync::Arc};

use crate::http_guard::{self, Limits};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{body::Incoming, Request, Response, StatusCode};
use pagestore_engine::{EngineError, Rule, RuleStats};
use pagestore_protocol::{members::Membership, node_id::format_uuid};
use pagestore_server::node::{Node, ShardMetrics};

/// What the endpoint reports on.
pub struct Admin {
    /// The running node (weak: the endpoint must not keep a stopping node alive).
    pub node: std::sync::Weak<Node>,
    /// The member list and ring the node serves under (replaced on membership changes).
    pub ring: std::sync::RwLock<RingState>,
    /// The etcd connection, when membership lives in etcd.
    pub etcd: Option<Arc<pagestore_mounts::etcd::Etcd>>,
}

/// The membership a node serves under.
#[derive(Clone)]
pub struct RingState {
    /// Members and ring.
    pub membership: Arc<Membership>,
    /// Ring members that are down (static ring mode with etcd).
    pub down: Vec<u128>,
    /// `static`, `dynamic`, or `file` (a static member file).
    pub mode: &'static str,
}

impl Admin {
    fn ring(&self) -> RingState {
        self.ring.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Binds `addr` and serves until the runtime stops (with [`Limits::ADMIN`]). Returns the
/// bound address.
pub async fn serve(admin: Arc<Admin>, addr: SocketAddr) -> std::io::Result<SocketAddr> {
    serve_with(admin, addr, Limits::ADMIN).await
}

/// [`serve`] with other limits: a deadline for request heads, a cap on open connections, and
/// a back-off when `accept` fails (out of file descriptors). The endpoint never reads request
/// bodies; hyper closes a connection whose body was not read.
pub async fn serve_with(
    admin: Arc<Admin>,
    addr: SocketAddr,
    limits: Limits,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(http_guard::serve(
        listener,
        limits,
        move |_peer| {
            let admin = admin.clone();
            hyper::service::service_fn(move |req| {
                let admin = admin.clone();
                async move { Ok::<_, Infallible>(handle(&admin, req).await) }
            })
        },
        std::future::pending::<()>(),
        std::time::Duration::ZERO,
    ));
    Ok(local)
}

fn text(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

async fn handle(admin: &Admin, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != hyper::Method::GET {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET\n".into(),
        );
    }
    let Some(node) = admin.node.upgrade() else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "stopping\n".into(),
        );
    };
    match req.uri().path() {
        "/health" => match node.metrics().await {
            Ok(m) => text(
                StatusCode::OK,
                "text/plain",
                format!("ok: {} shards serving\n", m.len()),
            ),
            Err(e) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("unhealthy: {e}\n"),
            ),
        },
        "/metrics" => match node.metrics().await {
            Ok(m) => {
                let id = format_uuid(node.node_id());
                let mut body = render(&id, &m);
                membership_metrics(&mut body, &id, admin);
                job_metrics(&mut body, &id, &node);
                if let Ok(rules) = rule_totals(&node).await {
                    body.push_str(&render_rules(&id, &rules));
                }
                text(StatusCode::OK, "text/plain; version=0.0.4", body)
            }
            Err(e) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("metrics unavailable: {e}\n"),
            ),
        },
        "/v1/jobs" => text(StatusCode::OK, "application/json", node.jobs().json()),
        "/v1/ring" => text(StatusCode::OK, "application/json", ring_json(&admin.ring())),
        "/v1/rules" => match rule_totals(&node).await {
            Ok(rules) => text(StatusCode::OK, "application/json", rules_json(&rules)),
            Err(e) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("rules unavailable: {e}\n"),
            ),
        },
        _ => text(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /health, /metrics, /v1/ring, /v1/rules or /v1/jobs\n".into(),
        ),
    }
}

/// Preload jobs reported to this node: how many per state, and each job's progress.
fn job_metrics(out: &mut String, node: &str, n: &Node) {
    let records = n.jobs().records();
    let now = crate::load::unix_now();
    let state = |r: &pagestore_protocol::jobs::JobRecord| crate::load::job_state(r, now);
    let _ = writeln!(
        out,
        "# HELP pagestore_load_jobs Preload jobs reported to this node, by state (running, done, failed, lost: no report for 30 s)."
    );
    let _ = writeln!(out, "# TYPE pagestore_load_jobs gauge");
    for st in ["running", "done", "failed", "lost"] {
        let count = records.iter().filter(|r| state(r) == st).count();
        let _ = writeln!(
            out,
            "pagestore_load_jobs{{node=\"{node}\",state=\"{st}\"}} {count}"
        );
    }
    type Field = fn(&pagestore_protocol::jobs::JobRecord) -> u64;
    let fields: [(&str, Field, &str); 5] = [
        ("files_total", |r| r.files_total, "Files in the job."),
        (
            "files_done",
            |r| r.files_done,
            "Files the job has finished (loaded or failed).",
        ),
        ("files_failed", |r| r.files_failed, "Files that failed."),
        (
            "bytes_done",
            |r| r.bytes_done,
            "Bytes of the finished files.",
        ),
        (
            "bytes_loaded",
            |r| r.bytes_loaded,
            "Bytes the job loaded from the under storage.",
        ),
    ];
    for (name, field, help) in fields {
        let _ = writeln!(out, "# HELP pagestore_load_job_{name} {help}");
        let _ = writeln!(out, "# TYPE pagestore_load_job_{name} gauge");
        for r in &records {
            let id = r.id.replace(['"', '\\', '\n'], "_");
            let _ = writeln!(
                out,
                "pagestore_load_job_{name}{{node=\"{node}\",job=\"{id}\",state=\"{}\"}} {}",
                state(r),
                field(r)
            );
        }
    }
}

/// Membership gauges: ring size, members down, and whether etcd answers.
fn membership_metrics(out: &mut String, node: &str, admin: &Admin) {
    let r = admin.ring();
    let mut gauge = |name: &str, help: &str, v: u64| {
        let _ = writeln!(out, "# HELP pagestore_{name} {help}");
        let _ = writeln!(out, "# TYPE pagestore_{name} gauge");
        let _ = writeln!(out, "pagestore_{name}{{node=\"{node}\"}} {v}");
    };
    gauge(
        "ring_nodes",
        "Nodes holding ring slots in this node's view.",
        r.membership.nodes().count() as u64,
    );
    gauge(
        "ring_nodes_down",
        "Ring nodes known to be down (static ring mode); their keys are read from the under storage.",
        r.down.len() as u64,
    );
    if let Some(e) = &admin.etcd {
        gauge(
            "etcd_reachable",
            "1 when the last request to etcd was answered.",
            u64::from(e.reachable()),
        );
    }
}

fn ring_json(r: &RingState) -> String {
    let m = &r.membership;
    let shares = m.ring().shares();
    let nodes: Vec<serde_json::Value> = m
        .nodes()
        .map(|n| {
            let share: f64 = shares
                .iter()
                .filter(|(s, _)| s.node == n.id)
                .map(|(_, v)| v)
                .sum();
            serde_json::json!({
                "id": format_uuid(n.id),
                "addr": n.addr.to_string(),
                "shards": n.shards,
                "share": share,
                "down": r.down.contains(&n.id),
                "shard_shares": shares
                    .iter()
                    .filter(|(s, _)| s.node == n.id)
                    .map(|(_, v)| *v)
                    .collect::<Vec<f64>>(),
            })
        })
        .collect();
    serde_json::json!({ "epoch": m.ring().epoch(), "mode": r.mode, "nodes": nodes }).to_string()
}

/// One per-shard metric family: name (after `pagestore_`), type, help text, value.
type Family = (
    &'static str,
    &'static str,
    &'static str,
    fn(&ShardMetrics) -> u64,
);

/// The per-shard families of `/metrics` (docs/OPERATIONS.md lists them).
const PER_SHARD: &[Family] = &[
    (
        "hits_total",
        "counter",
        "Page reads served from the cache.",
        |s| s.engine.hits,
    ),
    (
        "misses_total",
        "counter",
        "Page reads not in the cache.",
        |s| s.engine.misses,
    ),
    (
        "hit_bytes_total",
        "counter",
        "Bytes served from the cache.",
        |s| s.engine.hit_bytes,
    ),
    (
        "ufs_bytes_total",
        "counter",
        "Bytes read from the under storage (misses and preloads).",
        |s| s.loader.ufs_bytes,
    ),
    (
        "ufs_reads_total",
        "counter",
        "Page loads sent to the under storage.",
        |s| s.loader.ufs_reads,
    ),
    (
        "ufs_errors_total",
        "counter",
        "Under-storage requests that failed.",
        |s| s.loader.ufs_errors,
    ),
    (
        "store_failures_total",
        "counter",
        "Loaded pages served but not kept (cache or rule quota full, or a disk error).",
        |s| s.loader.store_failures,
    ),
    (
        "coalesced_misses_total",
        "counter",
        "Misses that joined a load already in flight.",
        |s| s.loader.coalesced,
    ),
    (
        "metadata_cache_hits_total",
        "counter",
        "Path metadata and listings answered from the TTL cache.",
        |s| s.loader.metadata_hits,
    ),
    (
        "metadata_cache_misses_total",
        "counter",
        "Path metadata and listings fetched from the under storage.",
        |s| s.loader.metadata_misses,
    ),
    (
        "requests_total",
        "counter",
        "Requests served by the shard's QUIC endpoint.",
        |s| s.requests,
    ),
    ("inserts_total", "counter", "Pages written.", |s| {
        s.engine.inserts
    }),
    ("insert_bytes_total", "counter", "Bytes written.", |s| {
        s.engine.insert_bytes
    }),
    ("evictions_total", "counter", "Pages evicted.", |s| {
        s.engine.evictions
    }),
    (
        "checksum_failures_total",
        "counter",
        "Pages whose data failed its checksum (dropped, never served).",
        |s| s.engine.checksum_failures,
    ),
    ("io_errors_total", "counter", "Disk errors.", |s| {
        s.engine.io_errors
    }),
    ("capacity_bytes", "gauge", "Cache capacity.", |s| {
        s.engine.capacity_bytes
    }),
    ("used_bytes", "gauge", "Bytes cached.", |s| s.engine.bytes),
    ("free_bytes", "gauge", "Capacity not holding pages.", |s| {
        s.engine.capacity_bytes.saturating_sub(s.engine.bytes)
    }),
    ("pages", "gauge", "Pages cached.", |s| s.engine.pages),
    (
        "ring_epoch",
        "gauge",
        "Ring epoch the shard serves under.",
        |s| s.epoch,
    ),
    (
        "replica_reads_total",
        "counter",
        "Reads served as a replica because a client's owner failed (fallbacks seen by nodes; clients count theirs).",
        |s| s.replica_reads,
    ),
    (
        "not_owner_total",
        "counter",
        "Requests answered NotOwner (a client routed with another ring; it falls back).",
        |s| s.not_owner,
    ),
    (
        "forbidden_total",
        "counter",
        "Requests refused because the peer's certificate role does not allow them (docs/SECURITY.md).",
        |s| s.forbidden,
    ),
    (
        "connections_total",
        "counter",
        "QUIC connections accepted.",
        |s| s.endpoint.connections,
    ),
    (
        "connections_refused_total",
        "counter",
        "QUIC connection attempts refused by the connection or handshake limits.",
        |s| s.endpoint.refused,
    ),
    (
        "quic_retries_total",
        "counter",
        "QUIC Retry packets sent to validate client addresses under load.",
        |s| s.endpoint.retries,
    ),
    (
        "requests_stalled_total",
        "counter",
        "Requests reset because their bytes stopped arriving, and replies reset because the \
         client stopped taking them (--request-stall-timeout).",
        |s| s.endpoint.stalled,
    ),
    (
        "request_budget_waits_total",
        "counter",
        "Times a request waited for the node's request or reply budget (--max-partial-bytes).",
        |s| s.endpoint.budget_waits,
    ),
    (
        "requests_rejected_total",
        "counter",
        "Request streams reset because the request was too large or malformed.",
        |s| s.endpoint.rejected,
    ),
];

/// The Prometheus text exposition of a node's shards.
pub fn render(node: &str, shards: &[ShardMetrics]) -> String {
    let mut out = String::new();
    for (name, kind, help, value) in PER_SHARD {
        let _ = writeln!(out, "# HELP pagestore_{name} {help}");
        let _ = writeln!(out, "# TYPE pagestore_{name} {kind}");
        for (i, s) in shards.iter().enumerate() {
            let _ = writeln!(
                out,
                "pagestore_{name}{{node=\"{node}\",shard=\"{i}\"}} {}",
                value(s)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP pagestore_request_latency_microseconds Request service time on the shard."
    );
    let _ = writeln!(out, "# TYPE pagestore_request_latency_microseconds summary");
    for (i, s) in shards.iter().enumerate() {
        for (q, v) in ["0.5", "0.9", "0.99", "0.999", "1"]
            .iter()
            .zip(s.latency_us)
        {
            let _ = writeln!(
                out,
                "pagestore_request_latency_microseconds{{node=\"{node}\",shard=\"{i}\",quantile=\"{q}\"}} {v}"
            );
        }
        let _ = writeln!(
            out,
            "pagestore_request_latency_microseconds_sum{{node=\"{node}\",shard=\"{i}\"}} {}",
            s.latency_sum_us
        );
        let _ = writeln!(
            out,
            "pagestore_request_latency_microseconds_count{{node=\"{node}\",shard=\"{i}\"}} {}",
            s.requests
        );
    }
    // Node-wide ratios: the first of the three numbers operators judge a cache by.
    let sum = |f: &dyn Fn(&ShardMetrics) -> u64| shards.iter().map(f).sum::<u64>() as f64;
    let (hits, misses) = (sum(&|s| s.engine.hits), sum(&|s| s.engine.misses));
    let (hit_bytes, ufs_bytes) = (sum(&|s| s.engine.hit_bytes), sum(&|s| s.loader.ufs_bytes));
    let ratio = |a: f64, b: f64| if a + b > 0.0 { a / (a + b) } else { 0.0 };
    let _ = writeln!(
        out,
        "# HELP pagestore_hit_ratio Hits / (hits + misses) since the node started.\n\
         # TYPE pagestore_hit_ratio gauge\n\
         pagestore_hit_ratio{{node=\"{node}\"}} {:.6}",
        ratio(hits, misses)
    );
    let _ = writeln!(
        out,
        "# HELP pagestore_byte_hit_ratio Bytes from the cache / (bytes from the cache + bytes from the under storage).\n\
         # TYPE pagestore_byte_hit_ratio gauge\n\
         pagestore_byte_hit_ratio{{node=\"{node}\"}} {:.6}",
        ratio(hit_bytes, ufs_bytes)
    );
    out
}

/// Every cache rule of the node with its accounting summed over the node's shards, in rule
/// number order.
pub async fn rule_totals(node: &Node) -> Result<Vec<(Rule, RuleStats)>, EngineError> {
    let Some(engine) = node.engine() else {
        return Err(EngineError::ShardGone);
    };
    let rules = engine.rules();
    let mut totals = vec![RuleStats::default(); rules.len() + 1];
    for h in engine.shards() {
        for (t, s) in totals.iter_mut().zip(h.rule_stats().await?) {
            t.add(&s);
        }
    }
    Ok(rules
        .iter()
        .map(|(n, r)| (r.clone(), totals[usize::from(n)]))
        .collect())
}

/// A Prometheus label value: backslash, double quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One per-rule metric family: name (after `pagestore_rule_`), type, help text, value (`None`:
/// no series for that rule).
type RuleFamily = (
    &'static str,
    &'static str,
    &'static str,
    fn(&Rule, &RuleStats) -> Option<u64>,
);

/// The per-rule families of `/metrics` (docs/OPERATIONS.md lists them); node-wide sums.
const PER_RULE: &[RuleFamily] = &[
    ("pages", "gauge", "Pages cached under the rule.", |_, s| {
        Some(s.pages)
    }),
    (
        "bytes",
        "gauge",
        "Bytes cached under the rule (page lengths).",
        |_, s| Some(s.bytes),
    ),
    (
        "pinned_bytes",
        "gauge",
        "Bytes of the rule's pages that are pinned (by the rule or by request).",
        |_, s| Some(s.pinned_bytes),
    ),
    (
        "quota_bytes",
        "gauge",
        "The rule's quota on this node (each shard enforces quota/shards in whole pages).",
        |r, _| r.quota,
    ),
    (
        "ttl_seconds",
        "gauge",
        "The rule's TTL: older pages are never served.",
        |r, _| r.ttl.map(|t| t.as_secs()),
    ),
    (
        "inserts_total",
        "counter",
        "Pages stored under the rule.",
        |_, s| Some(s.inserts),
    ),
    (
        "evictions_total",
        "counter",
        "Pages of the rule evicted by the eviction policy (cache full).",
        |_, s| Some(s.evictions),
    ),
    (
        "quota_evictions_total",
        "counter",
        "Pages of the rule evicted to keep it within its quota.",
        |_, s| Some(s.quota_evictions),
    ),
    (
        "quota_refusals_total",
        "counter",
        "Pages not stored: the rule was at its quota and none of its pages could be evicted.",
        |_, s| Some(s.quota_refusals),
    ),
    (
        "expirations_total",
        "counter",
        "Pages found past the rule's TTL on lookup (dropped, read again from the under storage).",
        |_, s| Some(s.expirations),
    ),
    (
        "pins_refused_total",
        "counter",
        "Pages of a pin rule stored unpinned because 90% of a shard's slots were pinned.",
        |_, s| Some(s.pins_refused),
    ),
];

/// The per-rule families of `/metrics` (nothing without rules).
pub fn render_rules(node: &str, rules: &[(Rule, RuleStats)]) -> String {
    let mut out = String::new();
    if rules.is_empty() {
        return out;
    }
    for (name, kind, help, value) in PER_RULE {
        let _ = writeln!(out, "# HELP pagestore_rule_{name} {help}");
        let _ = writeln!(out, "# TYPE pagestore_rule_{name} {kind}");
        for (r, s) in rules {
            if let Some(v) = value(r, s) {
                let _ = writeln!(
                    out,
                    "pagestore_rule_{name}{{node=\"{node}\",rule=\"{}\"}} {v}",
                    label(&r.prefix)
                );
            }
        }
    }
    out
}

/// `/v1/rules`: each rule's settings and the node's accounting for it.
fn rules_json(rules: &[(Rule, RuleStats)]) -> String {
    let list: Vec<serde_json::Value> = rules
        .iter()
        .map(|(r, s)| {
            serde_json::json!({
                "prefix": r.prefix,
                "quota_bytes": r.quota,
                "ttl_ms": r.ttl.map(|t| t.as_millis() as u64),
                "pin": r.pin,
                "pages": s.pages,
                "bytes": s.bytes,
                "pinned_pages": s.pinned_pages,
                "pinned_bytes": s.pinned_bytes,
                "inserts": s.inserts,
                "evictions": s.evictions,
                "quota_evictions": s.quota_evictions,
                "quota_refusals": s.quota_refusals,
                "expirations": s.expirations,
                "pins_refused": s.pins_refused,
            })
        })
        .collect();
    serde_json::json!({ "rules": list }).to_string()
}

#[cfg(test)]
mod rule_tests {
    use super::*;

    #[test]
    fn rule_families_parse_and_escape_labels() {
        let rule = Rule {
            prefix: "/a\"b".into(),
            quota: Some(1 << 20),
            ttl: None,
            pin: false,
        };
        let stats = RuleStats {
            pages: 2,
            bytes: 300,
            ..RuleStats::default()
        };
        let text = render_rules("n1", &[(rule, stats)]);
        assert!(
            text.contains("pagestore_rule_pages{node=\"n1\",rule=\"/a\\\"b\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("pagestore_rule_quota_bytes{node=\"n1\",rule=\"/a\\\"b\"} 1048576\n"));
        // No TTL, no series (the family's HELP and TYPE are still there).
        assert!(!text.contains("pagestore_rule_ttl_seconds{"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (_, v) = line.rsplit_once(' ').unwrap_or_default();
            assert!(v.parse::<u64>().is_ok(), "{line}");
        }
        assert_eq!(render_rules("n1", &[]), "");
    }
}
