//! A cluster of real `pagestored` processes on 127.0.0.1, for tests and benchmarks: one shared
//! CA, one static member file, free UDP port ranges, and helpers to start, kill and stop nodes.

use std::{
    io::{BufRead, BufReader},
    net::{SocketAddr, UdpSocket},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{mpsc, Arc},
    time::{Duration, Instant},
};

use pagestore_client::pool::{Pool, PoolOptions};
use pagestore_client::{tls, Client, ClientOptions, ClusterSource};
use pagestore_protocol::{
    frame::{Request, RequestBody, ResponseBody},
    tls::{ClusterCa, CA_NAME},
};

/// How to start the cluster.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The `pagestored` binary.
    pub binary: PathBuf,
    /// Where the nodes' cache directories, the CA and the member file go (must support O_DIRECT).
    pub dir: PathBuf,
    /// Nodes.
    pub nodes: usize,
    /// Shards per node.
    pub shards: u16,
    /// `--page-size`.
    pub page_size: String,
    /// `--cache-size` per node.
    pub cache_size: String,
    /// `--mount` values.
    pub mounts: Vec<String>,
    /// `--require-client-cert`.
    pub mtls: bool,
    /// `--metadata-ttl`.
    pub metadata_ttl: String,
    /// More flags for every node.
    pub extra: Vec<String>,
    /// Membership in etcd (`etcd://...`) instead of the member file.
    pub etcd: Option<String>,
    /// Nodes started by [`LocalCluster::start`] (default all; start the others with
    /// [`LocalCluster::start_node`]).
    pub start: Option<usize>,
}

impl Settings {
    /// Three nodes of two shards, 1 MiB pages, 256 MiB of cache each, a 1 s metadata TTL.
    pub fn new(binary: impl Into<PathBuf>, dir: impl Into<PathBuf>) -> Settings {
        Settings {
            binary: binary.into(),
            dir: dir.into(),
            nodes: 3,
            shards: 2,
            page_size: "1M".into(),
            cache_size: "256M".into(),
            mounts: Vec::new(),
            mtls: false,
            metadata_ttl: "1".into(),
            extra: Vec::new(),
            etcd: None,
            start: None,
        }
    }
}

/// One node process.
#[derive(Debug)]
pub struct NodeProc {
    /// The running process, if any.
    pub child: Option<Child>,
    /// Base address (shard `i` on port + `i`).
    pub base: SocketAddr,
    /// Its cache directory.
    pub cache_dir: PathBuf,
    /// Its admin endpoint (`http://IP:PORT`), once started.
    pub admin: Option<String>,
    /// Its UUID.
    pub id: String,
    /// Environment variables its process is started with (beside `PAGESTORE_LOG`), e.g. a
    /// wall clock set apart with libfaketime ([`faketime`]).
    pub env: Vec<(String, String)>,
    args: Vec<String>,
}

/// The environment that runs a process with its wall clock `offset` ahead (`"+3m"`) or behind
/// (`"-2m"`) this machine's, through libfaketime (Debian's `faketime` package); monotonic
/// clocks are left alone, so timers and timeouts run as usual. Errors when the library is not
/// installed.
pub fn faketime(offset: &str) -> Result<Vec<(String, String)>, String> {
    let lib = format!(
        "/usr/lib/{}-linux-gnu/faketime/libfaketimeMT.so.1",
        std::env::consts::ARCH
    );
    if !Path::new(&lib).exists() {
        return Err(format!(
            "{lib} is missing: install libfaketime (apt-get install faketime)"
        ));
    }
    Ok(vec![
        ("LD_PRELOAD".into(), lib),
        ("FAKETIME".into(), offset.into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
    ])
}

/// The running cluster. Dropping it kills every node.
#[derive(Debug)]
pub struct LocalCluster {
    binary: PathBuf,
    /// The cluster CA's directory (`ca-cert.pem`, `ca-key.pem`): a client TLS directory.
    pub ca_dir: PathBuf,
    /// The member file.
    pub members: PathBuf,
    /// The nodes.
    pub nodes: Vec<NodeProc>,
    /// Shards per node.
    pub shards: u16,
    /// The etcd URL, when membership lives in etcd.
    pub etcd: Option<String>,
}

fn err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// The lowest port the kernel hands a socket bound to port 0 (`ip_local_port_range`; 32768
/// when it cannot be read).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// `count` consecutive free UDP ports on 127.0.0.1, below the ephemeral range: a client socket
/// (every QUIC client binds one to port 0) can then never take a node's port between this
/// probe and the node's start, or while a test has the node stopped.
fn free_ports(count: u16) -> Result<u16, String> {
    let (low, high) = (10_000u16, ephemeral_low().max(12_000));
    let span = u64::from(high - low)
        .saturating_sub(u64::from(count))
        .max(1);
    let mut x = (u64::from(std::process::id()) << 20)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    for _ in 0..1000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let base = low + (x % span) as u16;
        let held: Vec<_> = (0..count)
            .map_while(|i| UdpSocket::bind(("127.0.0.1", base + i)).ok())
            .collect();
        if held.len() == count as usize {
            return Ok(base);
        }
    }
    Err("no free range of UDP ports on 127.0.0.1".into())
}

impl LocalCluster {
    /// Creates the CA, the member file and the nodes' directories, then starts every node.
    pub fn start(s: Settings) -> Result<LocalCluster, String> {
        let ca_dir = s.dir.join("ca");
        std::fs::create_dir_all(&ca_dir).map_err(|e| err(&ca_dir.display().to_string(), e))?;
        let ca = ClusterCa::generate(CA_NAME).map_err(|e| err("CA", e))?;
        ca.save(&ca_dir.join("ca-cert.pem"), &ca_dir.join("ca-key.pem"))
            .map_err(|e| err("CA", e))?;
        let ports = free_ports(s.shards * s.nodes as u16)?;
        let mut nodes = Vec::new();
        let mut member_lines = String::new();
        for i in 0..s.nodes {
            let cache_dir = s.dir.join(format!("node{i}"));
            let tls_dir = cache_dir.join("tls");
            std::fs::create_dir_all(&tls_dir).map_err(|e| err("node directory", e))?;
            for f in ["ca-cert.pem", "ca-key.pem"] {
                std::fs::copy(ca_dir.join(f), tls_dir.join(f)).map_err(|e| err(f, e))?;
            }
            let out = Command::new(&s.binary)
                .args(["node-id", "--cache-dir"])
                .arg(&cache_dir)
                .output()
                .map_err(|e| err(&s.binary.display().to_string(), e))?;
            if !out.status.success() {
                return Err(format!("pagestored node-id failed: {out:?}"));
            }
            let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let base = SocketAddr::from(([127, 0, 0, 1], ports + i as u16 * s.shards));
            member_lines.push_str(&format!("{id} {base} {}\n", s.shards));
            let mut args: Vec<String> = [
                "--cache-dir",
                &cache_dir.display().to_string(),
                "--cache-size",
                &s.cache_size,
                "--page-size",
                &s.page_size,
                "--shards",
                &s.shards.to_string(),
                "--listen",
                &base.to_string(),
                "--metadata-ttl",
                &s.metadata_ttl,
                "--no-pin",
                "--admin",
                "127.0.0.1:0",
            ]
            .iter()
            .map(|a| a.to_string())
            .collect();
            for m in &s.mounts {
                args.push("--mount".into());
                args.push(m.clone());
            }
            if s.mtls {
                args.push("--require-client-cert".into());
            }
            args.extend(s.extra.iter().cloned());
            nodes.push(NodeProc {
                child: None,
                base,
                cache_dir,
                admin: None,
                id,
                env: Vec::new(),
                args,
            });
        }
        let members = s.dir.join("members");
        std::fs::write(&members, member_lines).map_err(|e| err("member file", e))?;
        let mut c = LocalCluster {
            binary: s.binary,
            ca_dir,
            members,
            nodes,
            shards: s.shards,
            etcd: s.etcd,
        };
        for i in 0..s.start.unwrap_or(c.nodes.len()).min(c.nodes.len()) {
            c.start_node(i)?;
        }
        Ok(c)
    }

    /// Starts node `i` and waits (at most a minute) until it says it is ready.
    pub fn start_node(&mut self, i: usize) -> Result<(), String> {
        let membership: [std::ffi::OsString; 2] = match &self.etcd {
            Some(url) => ["--etcd".into(), url.into()],
            None => ["--members".into(), self.members.clone().into()],
        };
        let n = &mut self.nodes[i];
        let mut child = Command::new(&self.binary)
            .args(&n.args)
            .args(membership)
            .env(
                "PAGESTORE_LOG",
                std::env::var("PAGESTORE_LOG").unwrap_or_else(|_| "error".into()),
            )
            .envs(n.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| err("starting pagestored", e))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut admin = None;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(url) = line.trim().strip_prefix("admin") {
                    admin = url.trim().strip_suffix("/metrics").map(str::to_string);
                }
                if line.starts_with("ready") {
                    let _ = tx.send(admin.take());
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(admin) => n.admin = admin,
            Err(_) => {
                let _ = child.kill();
                return Err(format!("node {i} did not become ready: {:?}", child.wait()));
            }
        }
        n.child = Some(child);
        Ok(())
    }

    /// SIGKILLs node `i` (no goodbye to its clients) and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `signal` to node `i`'s process (SIGSTOP stalls it: its sockets stay open and take
    /// datagrams, nothing answers; SIGCONT resumes it).
    pub fn signal(&self, i: usize, signal: libc::c_int) -> Result<(), String> {
        let c = self.nodes[i].child.as_ref().ok_or("node not running")?;
        let pid = libc::pid_t::try_from(c.id()).map_err(|e| err("pid", e))?;
        // SAFETY: kill(2) on our own child's pid (not reaped: we hold its `Child`); no memory
        // is involved.
        if unsafe { libc::kill(pid, signal) } != 0 {
            return Err(err("kill", std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Stops node `i` with SIGTERM and returns its exit status.
    pub fn terminate(&mut self, i: usize) -> Result<std::process::ExitStatus, String> {
        let mut c = self.nodes[i].child.take().ok_or("node not running")?;
        let pid = libc::pid_t::try_from(c.id()).map_err(|e| err("pid", e))?;
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            return Err(err("kill", std::io::Error::last_os_error()));
        }
        c.wait().map_err(|e| err("wait", e))
    }

    /// Where clients find the cluster.
    pub fn source(&self) -> ClusterSource {
        match &self.etcd {
            Some(url) => ClusterSource::Etcd(url.clone()),
            None => ClusterSource::File(self.members.clone()),
        }
    }

    /// A client of the cluster (must be called inside a tokio runtime).
    pub async fn client(&self, options: ClientOptions) -> Result<Arc<Client>, String> {
        let tls = tls::client_config(&self.ca_dir).map_err(|e| e.to_string())?;
        Client::connect(&self.source(), tls, None, options)
            .await
            .map_err(|e| e.to_string())
    }

    /// `(hits, misses)` summed over every shard of every running node.
    pub async fn hits_and_misses(&self) -> Result<(u64, u64), String> {
        let all: Vec<usize> = (0..self.nodes.len()).collect();
        self.hits_and_misses_of(&all).await
    }

    /// `(hits, misses)` summed over every shard of the running nodes among `which`.
    pub async fn hits_and_misses_of(&self, which: &[usize]) -> Result<(u64, u64), String> {
        let tls = tls::client_config(&self.ca_dir).map_err(|e| e.to_string())?;
        let pool = Pool::new(
            tls,
            SocketAddr::from(([127, 0, 0, 1], 0)),
            PoolOptions::default(),
        )
        .map_err(|e| err("pool", e))?;
        let mut total = (0, 0);
        let running = which.iter().filter_map(|i| self.nodes.get(*i));
        for n in running.filter(|n| n.child.is_some()) {
            for s in 0..self.shards {
                let mut a = n.base;
                a.set_port(a.port() + s);
                let req = Request {
                    request_id: 9,
                    body: RequestBody::Stat,
                };
                let (resp, _) = pool
                    .request(a, &req, Default::default())
                    .await
                    .map_err(|e| e.to_string())?;
                match resp.body {
                    ResponseBody::Stat { hits, misses, .. } => {
                        total.0 += hits;
                        total.1 += misses;
                    }
                    other => return Err(format!("{a} answered Stat with {other:?}")),
                }
            }
        }
        pool.close();
        Ok(total)
    }

    /// Runs `pagectl` with this cluster's member file and TLS directory.
    pub fn pagectl(&self, pagectl: &Path, args: &[&str]) -> std::io::Result<std::process::Output> {
        let cluster: std::ffi::OsString = match &self.etcd {
            Some(url) => url.into(),
            None => self.members.clone().into(),
        };
        Command::new(pagectl)
            .arg("--cluster")
            .arg(cluster)
            .arg("--tls-dir")
            .arg(&self.ca_dir)
            .args(args)
            .output()
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

/// A plain HTTP/1.0 GET of `path` from `base` (`http://IP:PORT`): the status code and body.
pub fn http_get(base: &str, path: &str) -> Result<(u16, String), String> {
    let addr = base.trim_start_matches("http://");
    http_exchange(
        addr,
        &format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n"),
    )
}

/// Sends `request` (a whole HTTP/1.0 request) to `addr` and reads the answer to its end: the
/// status code and body.
fn http_exchange(addr: &str, request: &str) -> Result<(u16, String), String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| err(addr, e))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| err(addr, e))?;
    s.write_all(request.as_bytes()).map_err(|e| err(addr, e))?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).map_err(|e| err(addr, e))?;
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("{addr}: not an HTTP response"))?;
    let body = resp
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    Ok((status, body))
}

/// Seconds since `start`, for timelines.
pub fn since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64()
}

/// A real etcd server on 127.0.0.1 (the `etcd` binary, Debian package `etcd-server`), with its
/// data in a directory of its own so that it can be stopped and started again.
#[derive(Debug)]
pub struct EtcdServer {
    child: Option<Child>,
    /// Client port (the gRPC gateway pagestore talks to).
    pub client_port: u16,
    peer_port: u16,
    dir: PathBuf,
    /// TLS on the client port: `(server certificate, its key, CA of client certificates)`.
    tls: Option<(PathBuf, PathBuf, PathBuf)>,
    /// More etcd flags (e.g. `--auth-token-ttl=2`).
    extra: Vec<String>,
}

/// A POST of `body` (JSON) to `base` (`http://IP:PORT`) over HTTP/1.0, with `token` in the
/// `Authorization` header: the status code and body.
pub fn http_post(
    base: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> Result<(u16, String), String> {
    let addr = base.trim_start_matches("http://");
    let auth = token.map_or(String::new(), |t| format!("Authorization: {t}\r\n"));
    let request = format!(
        "POST {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n{auth}\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    http_exchange(addr, &request)
}

fn free_tcp_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| err("TCP port", e))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| err("TCP port", e))
}

impl EtcdServer {
    /// Starts etcd with its data under `dir` and waits until it answers.
    pub fn start(dir: &Path) -> Result<EtcdServer, String> {
        EtcdServer::start_with(dir, None, Vec::new())
    }

    /// Starts etcd with its data under `dir`, TLS on the client port when `tls` names the
    /// server certificate, its key and the CA that signs client certificates (clients must
    /// present one), and `extra` flags.
    pub fn start_with(
        dir: &Path,
        tls: Option<(PathBuf, PathBuf, PathBuf)>,
        extra: Vec<String>,
    ) -> Result<EtcdServer, String> {
        let mut e = EtcdServer {
            child: None,
            client_port: free_tcp_port()?,
            peer_port: free_tcp_port()?,
            dir: dir.to_path_buf(),
            tls,
            extra,
        };
        e.restart()?;
        Ok(e)
    }

    /// The URL nodes and clients use: `etcd://127.0.0.1:PORT/CLUSTER` (`etcds://` with TLS).
    pub fn url(&self, cluster: &str) -> String {
        let scheme = if self.tls.is_some() { "etcds" } else { "etcd" };
        format!("{scheme}://127.0.0.1:{}/{cluster}", self.client_port)
    }

    /// Turns authentication on (plain-HTTP servers only): a `root` user with `root_password`,
    /// and `user` with `password` whose role may read and write every key under
    /// `/pagestore/` and nothing else.
    pub fn enable_auth(
        &self,
        root_password: &str,
        user: &str,
        password: &str,
    ) -> Result<(), String> {
        let base = format!("http://127.0.0.1:{}", self.client_port);
        // base64 of "/pagestore/" and of the end of its range, "/pagestore0".
        let (key, end) = ("L3BhZ2VzdG9yZS8=", "L3BhZ2VzdG9yZTA=");
        let steps = [
            (
                "/v3/auth/user/add",
                serde_json::json!({"name": "root", "password": root_password}),
            ),
            (
                "/v3/auth/user/grant",
                serde_json::json!({"user": "root", "role": "root"}),
            ),
            (
                "/v3/auth/user/add",
                serde_json::json!({"name": user, "password": password}),
            ),
            (
                "/v3/auth/role/add",
                serde_json::json!({"name": "pagestore"}),
            ),
            (
                "/v3/auth/role/grant",
                serde_json::json!({"name": "pagestore", "perm":
                    {"permType": "READWRITE", "key": key, "range_end": end}}),
            ),
            (
                "/v3/auth/user/grant",
                serde_json::json!({"user": user, "role": "pagestore"}),
            ),
            ("/v3/auth/enable", serde_json::json!({})),
        ];
        for (path, body) in steps {
            let (status, text) = http_post(&base, path, &body.to_string(), None)?;
            if status != 200 || text.contains("\"error\"") {
                return Err(format!("etcd {path}: HTTP {status}: {text}"));
            }
        }
        Ok(())
    }

    /// SIGKILLs etcd (an outage).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts etcd (again) on the same ports and data, and waits (at most 30 s) until it
    /// answers.
    pub fn restart(&mut self) -> Result<(), String> {
        self.stop();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", self.client_port);
        let log_path = self.dir.join("etcd.log");
        let log = std::fs::File::create(&log_path).map_err(|e| err("etcd log", e))?;
        let mut tls_args: Vec<String> = Vec::new();
        if let Some((cert, key, ca)) = &self.tls {
            tls_args = vec![
                format!("--cert-file={}", cert.display()),
                format!("--key-file={}", key.display()),
                format!("--trusted-ca-file={}", ca.display()),
                "--client-cert-auth".to_string(),
            ];
        }
        let child = Command::new("etcd")
            .arg("--name=test")
            .arg(format!(
                "--data-dir={}",
                self.dir.join("etcd-data").display()
            ))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=test={peer}"))
            .args(&tls_args)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| {
                err(
                    "starting etcd (install the etcd-server package; the binary is `etcd`)",
                    e,
                )
            })?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.tls.is_some() {
                // No TLS client here: etcd's log says when it serves.
                let text = std::fs::read_to_string(&log_path).unwrap_or_default();
                if text.contains("ready to serve client requests") {
                    return Ok(());
                }
            } else if let Ok((200, body)) = http_get(&client, "/health") {
                if body.contains("true") {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "etcd did not become healthy; see {}",
                    self.dir.join("etcd.log").display()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
    }
}
