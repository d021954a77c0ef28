//! The node's admin HTTP endpoint (on the tokio side): `/health`, `/metrics` (Prometheus text
//! format) and `/v1/ring` (JSON).

use std::{convert::Infallible, fmt::Write as _, net::SocketAddr, sync::Arc};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{body::Incoming, Request, Response, StatusCode};
use pagestore_net::{
    members::Membership,
    node::{Node, ShardMetrics},
    node_id::format_uuid,
};

/// What the endpoint reports on.
pub struct Admin {
    /// The running node (weak: the endpoint must not keep a stopping node alive).
    pub node: std::sync::Weak<Node>,
    /// The member list and ring the node serves under.
    pub membership: Membership,
}

/// Binds `addr` and serves until the runtime stops. Returns the bound address.
pub async fn serve(admin: Arc<Admin>, addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let admin = admin.clone();
            tokio::spawn(async move {
                let io = hyper_util::rt::TokioIo::new(stream);
                let service = hyper::service::service_fn(move |req| {
                    let admin = admin.clone();
                    async move { Ok::<_, Infallible>(handle(&admin, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
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
            Ok(m) => text(
                StatusCode::OK,
                "text/plain; version=0.0.4",
                render(&format_uuid(node.node_id()), &m),
            ),
            Err(e) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("metrics unavailable: {e}\n"),
            ),
        },
        "/v1/ring" => text(
            StatusCode::OK,
            "application/json",
            ring_json(&admin.membership),
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /health, /metrics or /v1/ring\n".into(),
        ),
    }
}

fn ring_json(m: &Membership) -> String {
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
                "shard_shares": shares
                    .iter()
                    .filter(|(s, _)| s.node == n.id)
                    .map(|(_, v)| *v)
                    .collect::<Vec<f64>>(),
            })
        })
        .collect();
    serde_json::json!({ "epoch": m.ring().epoch(), "nodes": nodes }).to_string()
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
