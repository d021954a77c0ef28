//! Cluster membership and the mount table in etcd.
//!
//! pagestore talks to etcd (v3.4 or later) through etcd's JSON gateway: HTTP POSTs of JSON
//! with base64 keys and values, on the same client port as gRPC. That needs no code generation
//! and no extra protocol stack, and it is all this control plane uses: ranges, puts, one
//! compare-and-put, leases and a watch. Nothing here is on the data path: clients and nodes keep
//! serving on the last state they saw while etcd is unreachable.
//!
//! Protection ([`EtcdOptions`]): `etcds://` speaks HTTPS (the server verified against
//! `--etcd-ca`, or the system's roots; `--etcd-cert`/`--etcd-key` for client-certificate
//! authentication), and a user name with a password logs in through `/v3/auth/authenticate`:
//! the token it gives goes in the `Authorization` header of every request and is fetched again
//! when etcd says it is invalid (expired, or etcd restarted).
//!
//! Keys, under `/pagestore/<cluster>/` (docs/OPERATIONS.md has the same table):
//!
//! | key                  | value                                   | lifetime                 |
//! |----------------------|-----------------------------------------|--------------------------|
//! | `members/<uuid>`     | `{"addr":"IP:PORT","shards":N,"admin":…}` | the node's lease         |
//! | `ring/<uuid>`        | the same                                | until `pagectl node remove` |
//! | `mounts/<prefix>`    | the mount's URL, never with credentials | until changed            |
//! | `config/ring-mode`   | `dynamic` or `static`                   | set by the first node    |
//!
//! The dynamic ring is the live members; the static ring is every `ring/` slot, so a member
//! that is down keeps its share of the keys (read from the under storage meanwhile) and finds
//! its cache still warm when it returns.
//!
//! Mount URLs in etcd carry no secrets ([`credentials_in`]): every reader of the table could
//! see them. A node keeps the credentials of its own `--mount` settings and adds them back to
//! the mount of the same prefix and URL ([`with_local_credentials`]), or its object stores take
//! them from its environment (`AWS_ACCESS_KEY_ID` ...).

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use pagestore_protocol::{members::NodeInfo, node_id::format_uuid, node_id::parse_uuid};
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
    /// etcd refused the credentials, requires some, or denies access to the cluster's keys.
    Auth(String),
}

impl std::fmt::Display for EtcdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EtcdError::Config(m) => write!(f, "etcd settings: {m}"),
            EtcdError::Unreachable(m) => write!(f, "etcd unreachable: {m}"),
            EtcdError::Server(m) => write!(f, "etcd: {m}"),
            EtcdError::Auth(m) => write!(f, "etcd authentication: {m}"),
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

/// Environment variable: the etcd user name (`--etcd-user`).
pub const ENV_USER: &str = "PAGESTORE_ETCD_USER";
/// Environment variable: the etcd password itself.
pub const ENV_PASSWORD: &str = "PAGESTORE_ETCD_PASSWORD";
/// Environment variable: a file holding the etcd password (`--etcd-password-file`).
pub const ENV_PASSWORD_FILE: &str = "PAGESTORE_ETCD_PASSWORD_FILE";
/// Environment variable: the CA certificate(s) that sign etcd's server certificate (`--etcd-ca`).
pub const ENV_CA: &str = "PAGESTORE_ETCD_CA";
/// Environment variable: a client certificate for etcd (`--etcd-cert`).
pub const ENV_CERT: &str = "PAGESTORE_ETCD_CERT";
/// Environment variable: the client certificate's private key (`--etcd-key`).
pub const ENV_KEY: &str = "PAGESTORE_ETCD_KEY";

/// How to authenticate to etcd and verify it. `pagestored` and `pagectl` fill it from their
/// flags (over the environment); library users (`pagefs`, `pages3`) from the environment alone
/// ([`EtcdOptions::from_env`]). The password never goes on a command line.
#[derive(Clone, Default)]
pub struct EtcdOptions {
    /// etcd user (needs a password too).
    pub user: Option<String>,
    /// Its password.
    pub password: Option<String>,
    /// PEM file of the CA certificate(s) that sign etcd's server certificate; only these are
    /// trusted (without it: the system's roots). Needs `etcds://`.
    pub ca: Option<PathBuf>,
    /// PEM client certificate (chain) for client-certificate authentication. Needs `key`.
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
}

impl std::fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "(hidden)"))
            .field("ca", &self.ca)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish()
    }
}

impl EtcdOptions {
    /// The settings in `PAGESTORE_ETCD_USER`, `PAGESTORE_ETCD_PASSWORD` (or
    /// `PAGESTORE_ETCD_PASSWORD_FILE`), `PAGESTORE_ETCD_CA`, `PAGESTORE_ETCD_CERT` and
    /// `PAGESTORE_ETCD_KEY`; unset or empty variables are not set.
    pub fn from_env() -> Result<EtcdOptions, EtcdError> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let mut o = EtcdOptions {
            user: var(ENV_USER),
            password: var(ENV_PASSWORD),
            ca: var(ENV_CA).map(PathBuf::from),
            cert: var(ENV_CERT).map(PathBuf::from),
            key: var(ENV_KEY).map(PathBuf::from),
        };
        if o.password.is_none() {
            if let Some(f) = var(ENV_PASSWORD_FILE) {
                o.password = Some(read_password_file(Path::new(&f))?);
            }
        }
        Ok(o)
    }

    /// Whether any setting is given.
    pub fn is_empty(&self) -> bool {
        self.user.is_none()
            && self.password.is_none()
            && self.ca.is_none()
            && self.cert.is_none()
            && self.key.is_none()
    }

    /// Checks that the settings go together, for endpoints that are HTTPS or not.
    fn check(&self, https: bool) -> Result<(), EtcdError> {
        match (&self.user, &self.password) {
            (Some(u), None) => {
                return Err(EtcdError::Config(format!(
                    "etcd user {u:?} has no password: give --etcd-password-file FILE or set \
                     {ENV_PASSWORD}"
                )))
            }
            (None, Some(_)) => {
                return Err(EtcdError::Config(format!(
                    "an etcd password without a user: give --etcd-user USER or set {ENV_USER}"
                )))
            }
            (Some(u), Some(_)) if u.is_empty() => {
                return Err(EtcdError::Config("the etcd user name is empty".into()))
            }
            _ => {}
        }
        if self.cert.is_some() != self.key.is_some() {
            return Err(EtcdError::Config(
                "--etcd-cert and --etcd-key go together (a client certificate and its key)".into(),
            ));
        }
        if !https && (self.ca.is_some() || self.cert.is_some()) {
            return Err(EtcdError::Config(
                "--etcd-ca, --etcd-cert and --etcd-key need TLS: write the URL as \
                 etcds://HOST:PORT[/CLUSTER]"
                    .into(),
            ));
        }
        Ok(())
    }
}

impl EtcdOptions {
    /// [`EtcdOptions::from_env`] with a binary's etcd flags laid over it: each of `user`,
    /// `password_file` (read here), `ca`, `cert` and `key` that is given wins over its
    /// `PAGESTORE_ETCD_*` variable.
    pub fn from_env_and_flags(
        user: Option<String>,
        password_file: Option<&Path>,
        [ca, cert, key]: [Option<PathBuf>; 3],
    ) -> Result<EtcdOptions, EtcdError> {
        let mut o = EtcdOptions::from_env()?;
        if let Some(u) = user {
            o.user = Some(u);
        }
        if let Some(f) = password_file {
            o.password = Some(read_password_file(f)?);
        }
        o.ca = ca.or(o.ca);
        o.cert = cert.or(o.cert);
        o.key = key.or(o.key);
        Ok(o)
    }
}

/// Reads a password from `path`: its first line, without the line end. An empty password is
/// an error.
pub fn read_password_file(path: &Path) -> Result<String, EtcdError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        EtcdError::Config(format!(
            "cannot read the etcd password file {}: {e}",
            path.display()
        ))
    })?;
    let pw = text.lines().next().unwrap_or_default().to_string();
    if pw.is_empty() {
        return Err(EtcdError::Config(format!(
            "the etcd password file {} is empty",
            path.display()
        )));
    }
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(m) = std::fs::metadata(path) {
            if m.permissions().mode() & 0o077 != 0 {
                tracing::warn!(
                    file = %path.display(),
                    "the etcd password file is readable by other users; chmod 600 it"
                );
            }
        }
    }
    Ok(pw)
}

/// The login state of a connection with credentials.
#[derive(Clone, Debug)]
enum Token {
    /// Not logged in yet, or the last token was refused.
    None,
    /// The token to send.
    Valid(Arc<str>),
    /// etcd runs without authentication: send none.
    NotNeeded,
}

/// A connection to an etcd cluster, scoped to one pagestore cluster's keys.
pub struct Etcd {
    http: reqwest::Client,
    endpoints: Vec<String>,
    prefix: String,
    preferred: AtomicUsize,
    reachable: AtomicBool,
    /// User and password, when the connection logs in.
    login: Option<(String, String)>,
    token: Mutex<Token>,
    /// Held while logging in, so that concurrent requests log in once.
    login_lock: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("user", &self.login.as_ref().map(|(u, _)| u))
            .finish()
    }
}

/// Parses `etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]` (plain HTTP) or `etcds://...` (HTTPS)
/// into endpoints and the cluster name (default `default`).
pub fn parse_etcd_url(url: &str) -> Result<(Vec<String>, String), EtcdError> {
    let (scheme, rest) = match (url.strip_prefix("etcd://"), url.strip_prefix("etcds://")) {
        (Some(r), _) => ("http", r),
        (_, Some(r)) => ("https", r),
        _ => {
            return Err(EtcdError::Config(format!(
                "{url:?} is not an etcd URL; use etcd://HOST:PORT[,HOST:PORT...][/CLUSTER] (or \
                 etcds:// for TLS)"
            )))
        }
    };
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
    if hosts.contains('@') {
        return Err(EtcdError::Config(
            "no credentials in the etcd URL: use --etcd-user and --etcd-password-file (or \
             PAGESTORE_ETCD_USER and PAGESTORE_ETCD_PASSWORD)"
                .into(),
        ));
    }
    let endpoints: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("{scheme}://{h}"))
        .collect();
    if endpoints.is_empty() {
        return Err(EtcdError::Config(format!("{url:?} names no etcd endpoint")));
    }
    Ok((endpoints, cluster.to_string()))
}

/// Whether `s` is an etcd cluster URL (`etcd://` or `etcds://`).
pub fn is_etcd_url(s: &str) -> bool {
    s.starts_with("etcd://") || s.starts_with("etcds://")
}

/// The credentials `url` carries: `"user info"` for a user name or password before the host,
/// and each query parameter that [`crate::ufs::redact`] removes. Empty when the URL may be
/// stored where others can read it.
pub fn credentials_in(url: &str) -> Vec<String> {
    let Ok(u) = url::Url::parse(url) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if !u.username().is_empty() || u.password().is_some() {
        out.push("user info".to_string());
    }
    let kept: Vec<String> = url::Url::parse(&crate::ufs::redact(url))
        .map(|r| r.query_pairs().map(|(k, _)| k.into_owned()).collect())
        .unwrap_or_default();
    for (k, _) in u.query_pairs() {
        if !kept.iter().any(|x| *x == k) && !out.iter().any(|x| *x == k) {
            out.push(k.into_owned());
        }
    }
    out
}

/// `Err` with what to do instead when `url` carries credentials ([`credentials_in`]): mount
/// URLs in etcd must not.
pub fn no_credentials(url: &str) -> Result<(), EtcdError> {
    let secrets = credentials_in(url);
    if secrets.is_empty() {
        return Ok(());
    }
    Err(EtcdError::Config(format!(
        "the mount URL carries credentials ({}), and the mount table in etcd holds none (every \
         reader of etcd would see them): give the URL without them, and the credentials to the \
         nodes in their local configuration (a --mount with the same prefix and URL plus the \
         credentials) or their environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, \
         GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_ACCOUNT_KEY ...)",
        secrets.join(", ")
    )))
}

/// The mount table to serve from `table` (as stored in etcd, without credentials): a mount
/// whose prefix and URL match one of this node's own `local` mounts once that one's
/// credentials are removed takes the local URL, credentials included.
pub fn with_local_credentials(
    table: &[(String, String)],
    local: &[(String, String)],
) -> Vec<(String, String)> {
    table
        .iter()
        .map(|(prefix, url)| {
            let own = local.iter().find(|(p, u)| {
                p.trim_end_matches('/') == prefix.trim_end_matches('/')
                    && crate::ufs::redact(u) == *url
            });
            match own {
                Some((_, u)) => (prefix.clone(), u.clone()),
                None => (prefix.clone(), url.clone()),
            }
        })
        .collect()
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

/// `e` and its sources, joined (reqwest's own message alone hides the TLS or socket error).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        src = c.source();
    }
    s
}

fn read_file(what: &str, path: &Path) -> Result<Vec<u8>, EtcdError> {
    std::fs::read(path)
        .map_err(|e| EtcdError::Config(format!("cannot read {what} {}: {e}", path.display())))
}

/// How a failed request ended.
enum Failure {
    /// etcd refused the token (expired, or etcd restarted): log in again and retry.
    TokenRefused(String),
    Other(EtcdError),
}

impl Etcd {
    /// A handle for the cluster named in `url` (`etcd://HOST:PORT[,...][/CLUSTER]`, or
    /// `etcds://` for TLS), authenticating as `options` say. Connects lazily; must be used
    /// inside a tokio runtime.
    pub fn new(url: &str, options: &EtcdOptions) -> Result<Etcd, EtcdError> {
        let (endpoints, cluster) = parse_etcd_url(url)?;
        let https = url.starts_with("etcds://");
        options.check(https)?;
        let mut b = reqwest::Client::builder().connect_timeout(CALL_TIMEOUT);
        if https {
            b = b.https_only(true);
        }
        if let Some(ca) = &options.ca {
            let pem = read_file("the etcd CA certificate", ca)?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .ok()
                .filter(|c| !c.is_empty())
                .ok_or_else(|| {
                    EtcdError::Config(format!("{}: no PEM certificate in it", ca.display()))
                })?;
            b = b.tls_certs_only(certs);
        }
        if let (Some(cert), Some(key)) = (&options.cert, &options.key) {
            let mut pem = read_file("the etcd client certificate", cert)?;
            pem.push(b'\n');
            pem.extend(read_file("the etcd client key", key)?);
            let id = reqwest::Identity::from_pem(&pem).map_err(|e| {
                EtcdError::Config(format!(
                    "etcd client certificate {} with key {}: {}",
                    cert.display(),
                    key.display(),
                    chain(&e)
                ))
            })?;
            b = b.identity(id);
        }
        let http = b
            .build()
            .map_err(|e| EtcdError::Config(format!("HTTP client: {}", chain(&e))))?;
        let login = match (&options.user, &options.password) {
            (Some(u), Some(p)) => Some((u.clone(), p.clone())),
            _ => None,
        };
        if login.is_some() && !https {
            let local = endpoints.iter().all(|e| {
                let host = e.trim_start_matches("http://");
                host.starts_with("127.")
                    || host.starts_with("localhost")
                    || host.starts_with("[::1]")
            });
            if !local {
                tracing::warn!(
                    "the etcd password travels in plain HTTP; use etcds:// (TLS) across a network"
                );
            }
        }
        Ok(Etcd {
            http,
            endpoints,
            prefix: format!("/pagestore/{cluster}/"),
            preferred: AtomicUsize::new(0),
            reachable: AtomicBool::new(true),
            login,
            token: Mutex::new(Token::None),
            login_lock: tokio::sync::Mutex::new(()),
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
        token: Option<&str>,
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
            if let Some(t) = token {
                req = req.header("authorization", t);
            }
            if let Some(t) = timeout {
                req = req.timeout(t);
            }
            match req.send().await {
                Ok(resp) => {
                    self.preferred.store(idx, Ordering::Relaxed);
                    self.reachable.store(true, Ordering::Relaxed);
                    return Ok(resp);
                }
                Err(e) => last = format!("{}: {}", self.endpoints[idx], chain(&e)),
            }
        }
        self.reachable.store(false, Ordering::Relaxed);
        Err(EtcdError::Unreachable(last))
    }

    /// The token to send now (`None` without credentials, or when etcd needs none); logs in
    /// first when there is none.
    async fn token(&self) -> Result<Option<Arc<str>>, EtcdError> {
        if self.login.is_none() {
            return Ok(None);
        }
        let current = self.token.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match current {
            Token::Valid(t) => return Ok(Some(t)),
            Token::NotNeeded => return Ok(None),
            Token::None => {}
        }
        let _one = self.login_lock.lock().await;
        let current = self.token.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let fresh = match current {
            Token::None => self.authenticate().await?,
            t => t,
        };
        *self.token.lock().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        Ok(match fresh {
            Token::Valid(t) => Some(t),
            _ => None,
        })
    }

    /// Drops `used` (refused by etcd) so that the next request logs in again.
    fn forget_token(&self, used: Option<&Arc<str>>) {
        let mut t = self.token.lock().unwrap_or_else(|p| p.into_inner());
        let same = match (&*t, used) {
            (Token::Valid(a), Some(b)) => a == b,
            // etcd wants a token after all (authentication was enabled since).
            (Token::NotNeeded, None) => true,
            _ => false,
        };
        if same {
            *t = Token::None;
        }
    }

    /// Logs in with the user and password.
    async fn authenticate(&self) -> Result<Token, EtcdError> {
        let Some((user, password)) = &self.login else {
            return Ok(Token::NotNeeded);
        };
        let body = json!({"name": user, "password": password});
        let resp = self
            .post("/v3/auth/authenticate", &body, Some(CALL_TIMEOUT), None)
            .await?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| {
            self.reachable.store(false, Ordering::Relaxed);
            EtcdError::Unreachable(chain(&e))
        })?;
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| {
            EtcdError::Server(format!(
                "/v3/auth/authenticate: HTTP {status}, not JSON ({e})"
            ))
        })?;
        if let Some(t) = v["token"].as_str().filter(|t| !t.is_empty()) {
            tracing::debug!(user, "logged in to etcd");
            return Ok(Token::Valid(t.into()));
        }
        let msg = v["message"].as_str().or(v["error"].as_str()).unwrap_or("");
        if msg.contains("authentication is not enabled") {
            tracing::warn!(
                "etcd runs without authentication: --etcd-user is not needed, and anyone who \
                 reaches etcd can change the cluster (see docs/OPERATIONS.md, etcd)"
            );
            return Ok(Token::NotNeeded);
        }
        if msg.contains("invalid user ID or password") || msg.contains("authentication failed") {
            return Err(EtcdError::Auth(format!(
                "etcd refused user {user:?}: wrong user name or password"
            )));
        }
        Err(EtcdError::Auth(format!(
            "logging in as {user:?}: HTTP {status}: {msg}"
        )))
    }

    /// Classifies an error answer.
    fn failure(&self, path: &str, status: reqwest::StatusCode, v: &Value) -> Failure {
        let msg = v["message"]
            .as_str()
            .or(v["error"].as_str())
            .unwrap_or("")
            .to_string();
        let code = v["code"].as_u64();
        if status == reqwest::StatusCode::UNAUTHORIZED || code == Some(16) {
            return if self.login.is_some() {
                Failure::TokenRefused(msg)
            } else {
                Failure::Other(self.credentials_needed(&msg))
            };
        }
        if msg.contains("user name is empty") {
            return Failure::Other(self.credentials_needed(&msg));
        }
        if status == reqwest::StatusCode::FORBIDDEN
            || code == Some(7)
            || msg.contains("permission denied")
        {
            let who = self
                .login
                .as_ref()
                .map_or("this client (no --etcd-user)".to_string(), |(u, _)| {
                    format!("user {u:?}")
                });
            return Failure::Other(EtcdError::Auth(format!(
                "etcd denies {who} access to {}: grant its role readwrite on that key prefix \
                 (etcd says: {msg})",
                self.prefix
            )));
        }
        Failure::Other(EtcdError::Server(format!("{path}: HTTP {status}: {msg}")))
    }

    fn credentials_needed(&self, msg: &str) -> EtcdError {
        match &self.login {
            None => EtcdError::Auth(format!(
                "etcd requires authentication: give --etcd-user USER and --etcd-password-file \
                 FILE (or set {ENV_USER} and {ENV_PASSWORD}) (etcd says: {msg})"
            )),
            Some((u, _)) => EtcdError::Auth(format!(
                "etcd refused the login of user {u:?} (etcd says: {msg})"
            )),
        }
    }

    async fn call_once(
        &self,
        path: &str,
        body: &Value,
        token: Option<&str>,
    ) -> Result<Value, Failure> {
        let resp = self
            .post(path, body, Some(CALL_TIMEOUT), token)
            .await
            .map_err(Failure::Other)?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| {
            self.reachable.store(false, Ordering::Relaxed);
            Failure::Other(EtcdError::Unreachable(chain(&e)))
        })?;
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| {
            Failure::Other(EtcdError::Server(format!(
                "{path}: HTTP {status}, not JSON ({e})"
            )))
        })?;
        if !status.is_success() || v.get("error").is_some() {
            return Err(self.failure(path, status, &v));
        }
        Ok(v)
    }

    async fn call(&self, path: &str, body: Value) -> Result<Value, EtcdError> {
        let token = self.token().await?;
        match self.call_once(path, &body, token.as_deref()).await {
            Ok(v) => Ok(v),
            Err(Failure::Other(e)) => Err(e),
            Err(Failure::TokenRefused(msg)) => {
                // Expired, or etcd restarted: log in again, once.
                tracing::debug!(msg, "etcd refused the token; logging in again");
                self.forget_token(token.as_ref());
                let token = self.token().await?;
                match self.call_once(path, &body, token.as_deref()).await {
                    Ok(v) => Ok(v),
                    Err(Failure::Other(e)) => Err(e),
                    Err(Failure::TokenRefused(msg)) => {
                        self.forget_token(token.as_ref());
                        Err(self.credentials_needed(&msg))
                    }
                }
            }
        }
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

    /// Writes the mount table unless the cluster has one; returns the table in force. The URLs
    /// are stored without credentials ([`crate::ufs::redact`]): keep the originals locally
    /// and put them back with [`with_local_credentials`].
    pub async fn init_mounts(
        &self,
        mounts: &[(String, String)],
    ) -> Result<Vec<(String, String)>, EtcdError> {
        let existing = self.state().await?.mounts;
        if !existing.is_empty() {
            return Ok(existing);
        }
        for (prefix, url) in mounts {
            self.put_if_absent(&format!("mounts/{prefix}"), &crate::ufs::redact(url))
                .await?;
        }
        Ok(self.state().await?.mounts)
    }

    /// Adds or replaces one mount. A URL with credentials is refused: whoever may read the
    /// table in etcd would read them.
    pub async fn set_mount(&self, prefix: &str, url: &str) -> Result<(), EtcdError> {
        no_credentials(url)?;
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
        let token = tokio::time::timeout_at(deadline, self.token())
            .await
            .map_err(|_| EtcdError::Unreachable("login did not finish".into()))??;
        let post = self.post("/v3/watch", &body, None, token.as_deref());
        let mut resp = tokio::time::timeout_at(deadline, post)
            .await
            .map_err(|_| EtcdError::Unreachable("watch did not start".into()))??;
        if resp.status() == reqwest::StatusCode::UNAUTHORIZED {
            self.forget_token(token.as_ref());
            return Err(EtcdError::Auth("watch: etcd refused the token".into()));
        }
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
                if r["canceled"].as_bool() == Some(true) {
                    let reason = r["cancel_reason"].as_str().unwrap_or("");
                    if reason.contains("auth token") || reason.contains("Unauthenticated") {
                        // Expired: the next state read logs in again.
                        self.forget_token(token.as_ref());
                        return Err(EtcdError::Auth(format!("watch: {reason}")));
                    }
                    if reason.contains("permission denied") || reason.contains("user name is empty")
                    {
                        return Err(EtcdError::Auth(format!("watch: {reason}")));
                    }
                }
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

/// What [`keep_registered`] runs when the lease was lost, before it registers again: the
/// cluster counted this member down meanwhile.
pub type OnLeaseLost =
    Arc<dyn Fn() -> futures_util::future::BoxFuture<'static, ()> + Send + Sync + 'static>;

/// Keeps a registration alive: renews the lease every third of its TTL and registers again
/// when the lease was lost (e.g. after an etcd outage longer than the TTL), after running
/// `lost`. Runs until the task is aborted; [`Etcd::revoke`] the lease it reports in `lease`
/// at shutdown.
pub fn keep_registered(
    etcd: Arc<Etcd>,
    me: MemberRecord,
    ttl: Duration,
    lease: Arc<std::sync::atomic::AtomicU64>,
    lost: OnLeaseLost,
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
            lost().await;
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
        let (e, c) = parse_etcd_url("etcds://e1:2379,e2:2379/train").unwrap();
        assert_eq!(e, ["https://e1:2379", "https://e2:2379"]);
        assert_eq!(c, "train");
        assert!(is_etcd_url("etcds://e1:2379") && is_etcd_url("etcd://e1:2379"));
        assert!(!is_etcd_url("10.0.0.1:7400"));
        let e = parse_etcd_url("etcd://root:pw@h:1/a").unwrap_err();
        assert!(e.to_string().contains("--etcd-user"), "{e}");
    }

    #[test]
    fn options_that_do_not_go_together_are_refused() {
        let o = |user: Option<&str>, pw: Option<&str>| EtcdOptions {
            user: user.map(str::to_string),
            password: pw.map(str::to_string),
            ..EtcdOptions::default()
        };
        assert!(o(None, None).check(false).is_ok());
        assert!(o(Some("u"), Some("p")).check(false).is_ok());
        let e = o(Some("u"), None).check(false).unwrap_err().to_string();
        assert!(e.contains("--etcd-password-file"), "{e}");
        assert!(o(None, Some("p")).check(false).is_err());
        let ca = EtcdOptions {
            ca: Some("/ca.pem".into()),
            ..EtcdOptions::default()
        };
        let e = ca.check(false).unwrap_err().to_string();
        assert!(e.contains("etcds://"), "{e}");
        assert!(ca.check(true).is_ok());
        let half = EtcdOptions {
            cert: Some("/c.pem".into()),
            ..EtcdOptions::default()
        };
        assert!(half.check(true).is_err());
        let dbg = format!("{:?}", o(Some("u"), Some("hunter2")));
        assert!(!dbg.contains("hunter2"), "{dbg}");
    }

    #[test]
    fn password_files() {
        let dir = std::env::temp_dir().join(format!("pagestore-etcd-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("pw");
        std::fs::write(&f, "s3cret\n").unwrap();
        assert_eq!(read_password_file(&f).unwrap(), "s3cret");
        std::fs::write(&f, "\n").unwrap();
        assert!(read_password_file(&f).is_err());
        assert!(read_password_file(&dir.join("missing")).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn credentials_are_found_and_put_back() {
        assert!(credentials_in("file:///srv/data").is_empty());
        assert!(credentials_in("s3://b/p?region=eu-west-1&endpoint=http://h:9000").is_empty());
        assert_eq!(
            credentials_in("s3://b/p?region=r&access_key_id=AK&secret_access_key=SK"),
            ["access_key_id", "secret_access_key"]
        );
        assert_eq!(credentials_in("az://c/p?account=a&sas=xyz"), ["sas"]);
        assert_eq!(credentials_in("s3://user:pw@b/p"), ["user info"]);
        let local = vec![
            (
                "/s".to_string(),
                "s3://b/p?region=r&access_key_id=AK&secret_access_key=SK".to_string(),
            ),
            ("/f".to_string(), "file:///srv/f".to_string()),
        ];
        let table = vec![
            ("/s".to_string(), crate::ufs::redact(&local[0].1)),
            ("/f".to_string(), "file:///srv/other".to_string()),
            ("/g".to_string(), "s3://g/x?region=r".to_string()),
        ];
        assert_eq!(table[0].1, "s3://b/p?region=r");
        let served = with_local_credentials(&table, &local);
        assert_eq!(served[0], local[0], "the node's own credentials come back");
        assert_eq!(
            served[1], table[1],
            "another URL at the same prefix is etcd's"
        );
        assert_eq!(served[2], table[2]);
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
