//! The node's admin HTTP endpoint (on the tokio side): `/health`, `/metrics` (OpenMetrics text,
//! see [`crate::metrics`]), `/v1/ring`, `/v1/rules` and `/v1/jobs` (JSON).

use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use crate::metrics;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{body::Incoming, Request, Response, StatusCode};
use pagestore_cli::http_guard::{self, Limits};
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
    /// The node's write-back side.
    pub writeback: Option<Arc<crate::writeback::WriteBackNode>>,
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
            Ok(shards) => {
                let body = metrics::render(snapshot(admin, &node, shards).await);
                text(StatusCode::OK, metrics::CONTENT_TYPE, body)
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

/// Everything `/metrics` reports, read now.
async fn snapshot(admin: &Admin, node: &Node, shards: Vec<ShardMetrics>) -> metrics::Snapshot {
    let ring = admin.ring();
    let now = crate::load::unix_now();
    let jobs = node.jobs().records().into_iter();
    metrics::Snapshot {
        node: format_uuid(node.node_id()),
        shards,
        ring_nodes: ring.membership.nodes().count() as u64,
        ring_nodes_down: ring.down.len() as u64,
        etcd_reachable: admin.etcd.as_ref().map(|e| e.reachable()),
        jobs: jobs
            .map(|r| {
                let st = crate::load::job_state(&r, now);
                (r, st)
            })
            .collect(),
        rules: rule_totals(node).await.unwrap_or_default(),
        writeback: admin.writeback.as_ref().map(|w| w.metrics()),
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
