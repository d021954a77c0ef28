//! Cluster membership and the mount table in etcd.
//!
//! pagestore talks to etcd (v3.4 or later) through etcd's JSON gateway: plain HTTP POSTs of JSON
//! with base64 keys and values, on the same client port as gRPC. That needs no code generation
//! and no extra protocol stack, and it is all this control plane uses: ranges, puts, one
//! compare-and-put, leases and a watch. Nothing here is on the data path: clients and nodes keep
//! serving on the last state they saw while etcd is unreachable.
//!
//! Keys, under `/pagestore/<cluster>/` (docs/OPERATIONS.md has the same table):
//!
//! | key                  | value                                   | lifetime                 |
//! |----------------------|-----------------------------------------|--------------------------|
//! | `members/<uuid>`     | `{"addr":"IP:PORT","shards":N,"admin":…}` | the node's lease         |
//! | `ring/<uuid>`        | the same                                | until `pagectl node remove` |
//! | `mounts/<prefix>`    | the mount's URL (with its credentials)  | until changed            |
//! | `config/ring-mode`   | `dynamic` or `static`                   | set by the first node    |
//!
//! The dynamic ring is the live members; the static ring is every `ring/` slot, so a member
//! that is down keeps its share of the keys (read from the under storage meanwhile) and finds
//! its cache still warm when it returns.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use pagestore_net::{members::NodeInfo, node_id::format_uuid, node_id::parse_uuid};
use serde_json::{json, Value};

/// Default lease TTL of a member registration.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
/// Longest a state read waits for a watch event before reading the state again anyway (a
/// safety net against a watch that silently stalls, e.g. behind a frozen etcd).
const WATCH_POLL: Duration = Duration::from_secs(5);
/// Time allowed for one etcd request.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// Why an etcd operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdError {
    /// Bad `etcd://` URL or setting.
    Config(String),
    /// No endpoint answered.
    Unreachable(String),
    /// An endpoint answered with an error or something this code does not understand.
    Server(String),
}

impl std::fmt::Display for EtcdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EtcdError::Config(m) => write!(f, "etcd settings: {m}"),
            EtcdError::Unreachable(m) => write!(f, "etcd unreachable: {m}"),
            EtcdError::Server(m) => write!(f, "etcd: {m}"),
        }
    }
}

impl std::error::Error for EtcdError {}

/// Which members hold ring slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingMode {
    /// Only live members (a departed member's keys move to the others).
    Dynamic,
    /// Every registered member keeps its slot until removed; keys of a member that is down
    /// are read from the under storage until it returns.
    Static,
}

impl RingMode {
    /// The name stored in etcd and used in flags.
    pub fn as_str(self) -> &'static str {
        match self {
            RingMode::Dynamic => "dynamic",
            RingMode::Static => "static",
        }
    }
}

impl std::str::FromStr for RingMode {
    type Err = EtcdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "dynamic" => Ok(RingMode::Dynamic),
            "static" => Ok(RingMode::Static),
            other => Err(EtcdError::Config(format!(
                "ring mode {other:?}: use dynamic or static"
            ))),
        }
    }
}

/// A member as registered in etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberRecord {
    /// UUID, base address and shard count.
    pub info: NodeInfo,
    /// The member's admin HTTP endpoint, if it serves one.
    pub admin: Option<String>,
}

impl MemberRecord {
    fn to_json(&self) -> String {
        json!({
            "addr": self.info.addr.to_string(),
            "shards": self.info.shards,
            "admin": self.admin,
        })
        .to_string()
    }

    fn from_json(id: &str, value: &[u8]) -> Result<MemberRecord, String> {
        let id = parse_uuid(id).ok_or_else(|| format!("member key {id:?} is not a UUID"))?;
        let v: Value = serde_json::from_slice(value).map_err(|e| e.to_string())?;
        let addr: SocketAddr = v["addr"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .ok_or("no valid \"addr\"")?;
        let shards = v["shards"]
            .as_u64()
            .and_then(|s| u16::try_from(s).ok())
            .filter(|s| *s > 0)
            .ok_or("no valid \"shards\"")?;
        Ok(MemberRecord {
            info: NodeInfo { id, addr, shards },
            admin: v["admin"].as_str().map(str::to_string),
        })
    }
}

/// The cluster as stored in etcd at one revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterState {
    /// The etcd revision this state was read at (rings built from it use it as their epoch).
    pub revision: u64,
    /// Members with a live lease, by UUID.
    pub live: BTreeMap<u128, MemberRecord>,
    /// Ring slots (static mode), by UUID.
    pub slots: BTreeMap<u128, MemberRecord>,
    /// The mount table: logical prefix → URL.
    pub mounts: Vec<(String, String)>,
    /// The ring mode, once a node has set it.
    pub mode: Option<RingMode>,
}

impl ClusterState {
    /// The ring mode in force (dynamic until a node sets one).
    pub fn mode(&self) -> RingMode {
        self.mode.unwrap_or(RingMode::Dynamic)
    }

    /// The members that hold ring slots.
    pub fn ring_nodes(&self) -> Vec<NodeInfo> {
        let set = match self.mode() {
            RingMode::Dynamic => &self.live,
            RingMode::Static => &self.slots,
        };
        set.values().map(|r| r.info).collect()
    }

    /// Ring members that are not live: their keys are read from the under storage.
    pub fn down(&self) -> Vec<u128> {
        self.ring_nodes()
            .iter()
            .map(|n| n.id)
            .filter(|id| !self.live.contains_key(id))
            .collect()
    }

    /// Whether two states describe the same cluster (revisions aside).
    pub fn same_as(&self, other: &ClusterState) -> bool {
        self.live == other.live
            && self.slots == other.slots
            && self.mounts == other.mounts
            && self.mode == other.mode
    }
}

/// A connection to an etcd cluster, scoped to one pagestore cluster's keys.
#[derive(Debug)]
pub struct Etcd {
    http: reqwest::Client,
    endpoints: Vec<String>,
    prefix: String,
    preferred: AtomicUsize,
    reachable: AtomicBool,
}

/// Parses `etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]` into endpoints and the cluster name
/// (default `default`).
pub fn parse_etcd_url(url: &str) -> Result<(Vec<String>, String), EtcdError> {
    let rest = url.strip_prefix("etcd://").ok_or_else(|| {
        EtcdError::Config(format!(
            "{url:?} is not an etcd URL; use etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]"
        ))
    })?;
    let (hosts, cluster) = match rest.split_once('/') {
        Some((h, c)) => (h, c.trim_end_matches('/')),
        None => (rest, ""),
    };
    let cluster = if cluster.is_empty() {
        "default"
    } else {
        cluster
    };
    if !cluster
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    {
        return Err(EtcdError::Config(format!(
            "cluster name {cluster:?}: use letters, digits, '-', '_' and '.'"
        )));
    }
    let endpoints: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("http://{h}"))
        .collect();
    if endpoints.is_empty() {
        return Err(EtcdError::Config(format!("{url:?} names no etcd endpoint")));
    }
    Ok((endpoints, cluster.to_string()))
}

fn b64(s: &[u8]) -> String {
    B64.encode(s)
}

fn unb64(v: &Value) -> Result<Vec<u8>, EtcdError> {
    match v.as_str() {
        None => Ok(Vec::new()), // empty values are omitted by the gateway
        Some(s) => B64
            .decode(s)
            .map_err(|e| EtcdError::Server(format!("bad base64 from etcd: {e}"))),
    }
}

/// The key just past every key starting with `prefix` (for range requests).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// etcd encodes 64-bit integers as JSON strings.
fn int(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

impl Etcd {
    /// A handle for the cluster named in `url` (`etcd://HOST:PORT[,...][/CLUSTER]`). Connects
    /// lazily; must be used inside a tokio runtime.
    pub fn new(url: &str) -> Result<Etcd, EtcdError> {
        let (endpoints, cluster) = parse_etcd_url(url)?;
        let http = reqwest::Client::builder()
            .connect_timeout(CALL_TIMEOUT)
            .build()
            .map_err(|e| EtcdError::Config(format!("HTTP client: {e}")))?;
        Ok(Etcd {
            http,
            endpoints,
            prefix: format!("/pagestore/{cluster}/"),
            preferred: AtomicUsize::new(0),
            reachable: AtomicBool::new(true),
        })
    }

    /// The key prefix of this cluster.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether the last request reached an endpoint.
    pub fn reachable(&self) -> bool {
        self.reachable.load(Ordering::Relaxed)
    }

    /// POSTs `body` to `path` on the first endpoint that answers, starting with the one that
    /// answered last. `timeout`: `None` for streams, which the caller bounds itself.
    async fn post(
        &self,
        path: &str,
        body: &Value,
        timeout: Option<Duration>,
    ) -> Result<reqwest::Response, EtcdError> {
        let n = self.endpoints.len();
        let first = self.preferred.load(Ordering::Relaxed);
        let mut last = String::new();
        for i in 0..n {
            let idx = (first + i) % n;
            let mut req = self
                .http
                .post(format!("{}{path}", self.endpoints[idx]))
                .header("content-type", "application/json")
                .body(body.to_string());
            if let Some(t) = timeout {
                req = req.timeout(t);
            }
            match req.send().await {
                Ok(resp) => {
                    self.preferred.store(idx, Ordering::Relaxed);
                    self.reachable.store(true, Ordering::Relaxed);
                    return Ok(resp);
                }
                Err(e) => last = format!("{}: {e}", self.endpoints[idx]),
            }
        }
        self.reachable.store(false, Ordering::Relaxed);
        Err(EtcdError::Unreachable(last))
    }

    async fn call(&self, path: &str, body: Value) -> Result<Value, EtcdError> {
        let resp = self.post(path, &body, Some(CALL_TIMEOUT)).await?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| {
            self.reachable.store(false, Ordering::Relaxed);
            EtcdError::Unreachable(e.to_string())
        })?;
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| EtcdError::Server(format!("{path}: HTTP {status}, not JSON ({e})")))?;
        if !status.is_success() || v.get("error").is_some() {
            let msg = v["message"].as_str().or(v["error"].as_str()).unwrap_or("");
            return Err(EtcdError::Server(format!("{path}: HTTP {status}: {msg}")));
        }
        Ok(v)
    }

    /// Every key under this cluster's prefix, with the store revision.
    async fn range_all(&self) -> Result<(u64, Vec<(String, Vec<u8>)>), EtcdError> {
        let v = self
            .call(
                "/v3/kv/range",
                json!({"key": b64(self.prefix.as_bytes()), "range_end": b64(&prefix_end(&self.prefix))}),
            )
            .await?;
        let revision = int(&v["header"]["revision"]);
        let mut out = Vec::new();
        if let Some(kvs) = v["kvs"].as_array() {
            for kv in kvs {
                let key = String::from_utf8(unb64(&kv["key"])?)
                    .map_err(|_| EtcdError::Server("a key is not UTF-8".into()))?;
                out.push((key, unb64(&kv["value"])?));
            }
        }
        Ok((revision, out))
    }

    /// The cluster's state now.
    pub async fn state(&self) -> Result<ClusterState, EtcdError> {
        let (revision, kvs) = self.range_all().await?;
        let mut s = ClusterState {
            revision,
            ..ClusterState::default()
        };
        for (key, value) in kvs {
            let Some(rel) = key.strip_prefix(&self.prefix) else {
                continue;
            };
            let record = |id: &str| match MemberRecord::from_json(id, &value) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!(key, error = %e, "ignoring a malformed member record in etcd");
                    None
                }
            };
            if let Some(id) = rel.strip_prefix("members/") {
                if let Some(r) = record(id) {
                    s.live.insert(r.info.id, r);
                }
            } else if let Some(id) = rel.strip_prefix("ring/") {
                if let Some(r) = record(id) {
                    s.slots.insert(r.info.id, r);
                }
            } else if let Some(prefix) = rel.strip_prefix("mounts/") {
                match String::from_utf8(value) {
                    Ok(url) => s.mounts.push((prefix.to_string(), url)),
                    Err(_) => tracing::warn!(key, "ignoring a mount URL that is not UTF-8"),
                }
            } else if rel == "config/ring-mode" {
                match String::from_utf8_lossy(&value).parse() {
                    Ok(m) => s.mode = Some(m),
                    Err(e) => tracing::warn!(error = %e, "ignoring the ring mode in etcd"),
                }
            }
        }
        Ok(s)
    }

    async fn put(&self, rel: &str, value: &str, lease: Option<u64>) -> Result<(), EtcdError> {
        let mut body = json!({
            "key": b64(format!("{}{rel}", self.prefix).as_bytes()),
            "value": b64(value.as_bytes()),
        });
        if let Some(l) = lease {
            body["lease"] = Value::String(l.to_string());
        }
        self.call("/v3/kv/put", body).await.map(drop)
    }

    /// Puts `value` at `rel` unless the key exists. Returns whether it was written.
    async fn put_if_absent(&self, rel: &str, value: &str) -> Result<bool, EtcdError> {
        let key = b64(format!("{}{rel}", self.prefix).as_bytes());
        let v = self
            .call(
                "/v3/kv/txn",
                json!({
                    "compare": [{"key": key, "target": "CREATE", "create_revision": "0"}],
                    "success": [{"request_put": {"key": key, "value": b64(value.as_bytes())}}],
                }),
            )
            .await?;
        Ok(v["succeeded"].as_bool().unwrap_or(false))
    }

    async fn delete(&self, rel: &str) -> Result<bool, EtcdError> {
        let v = self
            .call(
                "/v3/kv/deleterange",
                json!({"key": b64(format!("{}{rel}", self.prefix).as_bytes())}),
            )
            .await?;
        Ok(int(&v["deleted"]) > 0)
    }

    /// Sets the ring mode unless the cluster has one; returns the mode in force.
    pub async fn init_ring_mode(&self, mode: RingMode) -> Result<RingMode, EtcdError> {
        if self
            .put_if_absent("config/ring-mode", mode.as_str())
            .await?
        {
            return Ok(mode);
        }
        Ok(self.state().await?.mode())
    }

    /// Writes the mount table unless the cluster has one; returns the table in force.
    pub async fn init_mounts(
        &self,
        mounts: &[(String, String)],
    ) -> Result<Vec<(String, String)>, EtcdError> {
        let existing = self.state().await?.mounts;
        if !existing.is_empty() {
            return Ok(existing);
        }
        for (prefix, url) in mounts {
            self.put_if_absent(&format!("mounts/{prefix}"), url).await?;
        }
        Ok(self.state().await?.mounts)
    }

    /// Adds or replaces one mount.
    pub async fn set_mount(&self, prefix: &str, url: &str) -> Result<(), EtcdError> {
        self.put(&format!("mounts/{prefix}"), url, None).await
    }

    /// Removes one mount; returns whether it existed.
    pub async fn remove_mount(&self, prefix: &str) -> Result<bool, EtcdError> {
        self.delete(&format!("mounts/{prefix}")).await
    }

    /// Removes a member's ring slot (a permanent departure in static mode); returns whether
    /// it existed.
    pub async fn remove_slot(&self, id: u128) -> Result<bool, EtcdError> {
        self.delete(&format!("ring/{}", format_uuid(id))).await
    }

    /// Registers `me` as live under a new lease of `ttl` and records its ring slot. Returns
    /// the lease.
    pub async fn register(&self, me: &MemberRecord, ttl: Duration) -> Result<u64, EtcdError> {
        let v = self
            .call(
                "/v3/lease/grant",
                json!({"TTL": ttl.as_secs().max(1).to_string()}),
            )
            .await?;
        let lease = int(&v["ID"]);
        if lease == 0 {
            return Err(EtcdError::Server("lease grant returned no lease".into()));
        }
        let id = format_uuid(me.info.id);
        let value = me.to_json();
        self.put(&format!("ring/{id}"), &value, None).await?;
        self.put(&format!("members/{id}"), &value, Some(lease))
            .await?;
        Ok(lease)
    }

    /// Renews `lease`. `Ok(false)`: the lease is gone (it expired), register again.
    pub async fn keep_alive(&self, lease: u64) -> Result<bool, EtcdError> {
        let v = self
            .call("/v3/lease/keepalive", json!({"ID": lease.to_string()}))
            .await?;
        Ok(int(&v["result"]["TTL"]) > 0)
    }

    /// Ends `lease` now: the member leaves the live set at once.
    pub async fn revoke(&self, lease: u64) -> Result<(), EtcdError> {
        match self
            .call("/v3/lease/revoke", json!({"ID": lease.to_string()}))
            .await
        {
            Ok(_) => Ok(()),
            Err(EtcdError::Server(m)) if m.contains("not found") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Waits until something under the prefix changes after `revision`, or `max_wait`
    /// passes. `Ok(true)`: a change was seen.
    async fn wait_change(&self, revision: u64, max_wait: Duration) -> Result<bool, EtcdError> {
        let body = json!({"create_request": {
            "key": b64(self.prefix.as_bytes()),
            "range_end": b64(&prefix_end(&self.prefix)),
            "start_revision": (revision + 1).to_string(),
        }});
        let deadline = tokio::time::Instant::now() + max_wait;
        let mut resp = tokio::time::timeout_at(deadline, self.post("/v3/watch", &body, None))
            .await
            .map_err(|_| EtcdError::Unreachable("watch did not start".into()))??;
        if !resp.status().is_success() {
            return Err(EtcdError::Server(format!("watch: HTTP {}", resp.status())));
        }
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let chunk = match tokio::time::timeout_at(deadline, resp.chunk()).await {
                Err(_) => return Ok(false),
                Ok(Err(e)) => return Err(EtcdError::Unreachable(format!("watch: {e}"))),
                Ok(Ok(None)) => return Err(EtcdError::Unreachable("watch stream ended".into())),
                Ok(Ok(Some(c))) => c,
            };
            buf.extend_from_slice(&chunk);
            while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                let Ok(v) = serde_json::from_slice::<Value>(&line) else {
                    continue;
                };
                let r = &v["result"];
                if r["events"].is_array() || r["canceled"].as_bool() == Some(true) {
                    // A change, or a watch etcd cannot serve (e.g. compacted): read again.
                    return Ok(true);
                }
                if v.get("error").is_some() {
                    return Err(EtcdError::Server(format!("watch: {v}")));
                }
            }
        }
    }
}

/// Follows the cluster's state: calls `apply` with the state now and after every change
/// (within a watch round trip), until `apply` returns false. While etcd is unreachable it
/// retries every second and `apply` is not called: whoever follows keeps its last state.
pub fn follow(
    etcd: Arc<Etcd>,
    mut last: Option<ClusterState>,
    mut apply: impl FnMut(&ClusterState) -> bool + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut warned = false;
        loop {
            match etcd.state().await {
                Ok(s) => {
                    if warned {
                        tracing::info!("etcd reachable again; following membership");
                        warned = false;
                    }
                    let changed = last.as_ref().is_none_or(|l| !l.same_as(&s));
                    if changed && !apply(&s) {
                        return;
                    }
                    let revision = s.revision;
                    if changed {
                        last = Some(s);
                    }
                    match etcd.wait_change(revision, WATCH_POLL).await {
                        Ok(_) => {}
                        Err(e) => {
                            tracing::debug!(error = %e, "etcd watch");
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    }
                }
                Err(e) => {
                    if !warned {
                        tracing::warn!(error = %e, "cannot read membership from etcd; serving on the last known ring");
                        warned = true;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    })
}

/// Keeps a registration alive: renews the lease every third of its TTL and registers again
/// when the lease was lost (e.g. after an etcd outage longer than the TTL). Runs until the
/// task is aborted; [`Etcd::revoke`] the lease it reports in `lease` at shutdown.
pub fn keep_registered(
    etcd: Arc<Etcd>,
    me: MemberRecord,
    ttl: Duration,
    lease: Arc<std::sync::atomic::AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let period = (ttl / 3).max(Duration::from_millis(300));
        let mut warned = false;
        loop {
            tokio::time::sleep(period).await;
            let current = lease.load(Ordering::Relaxed);
            let alive = match etcd.keep_alive(current).await {
                Ok(a) => a,
                Err(e) => {
                    if !warned {
                        tracing::warn!(error = %e, "cannot renew the membership lease; still serving");
                        warned = true;
                    }
                    continue;
                }
            };
            if alive {
                if warned {
                    tracing::info!("membership lease renewed again");
                    warned = false;
                }
                continue;
            }
            match etcd.register(&me, ttl).await {
                Ok(new) => {
                    lease.store(new, Ordering::Relaxed);
                    tracing::info!("membership lease had expired; registered again");
                    warned = false;
                }
                Err(e) => tracing::warn!(error = %e, "cannot register again in etcd"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let (e, c) = parse_etcd_url("etcd://10.0.0.1:2379,10.0.0.2:2379/train").unwrap();
        assert_eq!(e, ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]);
        assert_eq!(c, "train");
        let (e, c) = parse_etcd_url("etcd://127.0.0.1:2379").unwrap();
        assert_eq!(e, ["http://127.0.0.1:2379"]);
        assert_eq!(c, "default");
        assert!(parse_etcd_url("http://127.0.0.1:2379").is_err());
        assert!(parse_etcd_url("etcd:///x").is_err());
        assert!(parse_etcd_url("etcd://h:1/a/b").is_err());
    }

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end("/p/"), b"/p0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
    }

    #[test]
    fn records_round_trip_and_reject_garbage() {
        let r = MemberRecord {
            info: NodeInfo {
                id: 0x1234_5678_9abc_def0_1234_5678_9abc_def0,
                addr: "10.1.2.3:7400".parse().unwrap(),
                shards: 4,
            },
            admin: Some("10.1.2.3:7399".into()),
        };
        let id = format_uuid(r.info.id);
        assert_eq!(
            MemberRecord::from_json(&id, r.to_json().as_bytes()).unwrap(),
            r
        );
        assert!(MemberRecord::from_json(&id, b"{").is_err());
        assert!(MemberRecord::from_json(&id, br#"{"addr":"x","shards":1}"#).is_err());
        assert!(MemberRecord::from_json(&id, br#"{"addr":"1.2.3.4:5","shards":0}"#).is_err());
        assert!(MemberRecord::from_json("nope", r.to_json().as_bytes()).is_err());
    }

    #[test]
    fn ring_modes_choose_members() {
        let rec = |id: u128| MemberRecord {
            info: NodeInfo {
                id,
                addr: "127.0.0.1:1".parse().unwrap(),
                shards: 1,
            },
            admin: None,
        };
        let mut s = ClusterState::default();
        for id in [1, 2, 3] {
            s.slots.insert(id, rec(id));
        }
        for id in [1, 3] {
            s.live.insert(id, rec(id));
        }
        assert_eq!(s.mode(), RingMode::Dynamic);
        assert_eq!(s.ring_nodes().len(), 2);
        assert!(s.down().is_empty());
        s.mode = Some(RingMode::Static);
        assert_eq!(s.ring_nodes().len(), 3);
        assert_eq!(s.down(), vec![2]);
    }
}
