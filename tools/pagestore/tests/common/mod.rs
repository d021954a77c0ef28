//! A real cluster for tests: `pagestored` processes on 127.0.0.1 sharing one CA and one static
//! member file, and clients connected to it.
#![allow(dead_code, clippy::unwrap_used)]

use std::{
    io::{BufRead, BufReader},
    net::{SocketAddr, UdpSocket},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{mpsc, Arc},
    time::{Duration, Instant},
};

use pagestore_client::{tls, Client, ClientOptions, ClusterSource};
use pagestore_net::{
    frame::{Request, RequestBody, ResponseBody},
    tls::{ClusterCa, CA_NAME},
};

pub const PAGESTORED: &str = env!("CARGO_BIN_EXE_pagestored");
pub const PAGECTL: &str = env!("CARGO_BIN_EXE_pagectl");

pub struct NodeProc {
    pub child: Option<Child>,
    pub base: SocketAddr,
    pub cache_dir: PathBuf,
    pub args: Vec<String>,
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub ca_dir: PathBuf,
    pub members: PathBuf,
    pub nodes: Vec<NodeProc>,
    pub shards: u16,
}

pub struct Settings {
    pub nodes: usize,
    pub shards: u16,
    pub page_size: &'static str,
    pub mounts: Vec<String>,
    pub mtls: bool,
    pub metadata_ttl: &'static str,
    pub extra: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            nodes: 3,
            shards: 2,
            page_size: "1M",
            mounts: Vec::new(),
            mtls: false,
            metadata_ttl: "1",
            extra: Vec::new(),
        }
    }
}

/// `count` consecutive free UDP ports on 127.0.0.1.
fn free_ports(count: u16) -> u16 {
    let seed = std::process::id() as u64 ^ Instant::now().elapsed().as_nanos() as u64;
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for _ in 0..1000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let base = 20_000 + (x % 30_000) as u16;
        let held: Vec<_> = (0..count)
            .map_while(|i| UdpSocket::bind(("127.0.0.1", base + i)).ok())
            .collect();
        if held.len() == count as usize {
            return base;
        }
    }
    panic!("no free UDP port range");
}

impl Cluster {
    pub fn start(s: Settings) -> Cluster {
        let dir = tempfile::tempdir_in(
            std::env::var("PAGESTORE_TEST_DIR").unwrap_or_else(|_| "/var/tmp".into()),
        )
        .unwrap();
        let ca_dir = dir.path().join("ca");
        std::fs::create_dir_all(&ca_dir).unwrap();
        let ca = ClusterCa::generate(CA_NAME).unwrap();
        ca.save(&ca_dir.join("ca-cert.pem"), &ca_dir.join("ca-key.pem"))
            .unwrap();
        let ports = free_ports(s.shards * s.nodes as u16);
        let mut nodes = Vec::new();
        let mut member_lines = String::new();
        for i in 0..s.nodes {
            let cache_dir = dir.path().join(format!("node{i}"));
            let tls_dir = cache_dir.join("tls");
            std::fs::create_dir_all(&tls_dir).unwrap();
            for f in ["ca-cert.pem", "ca-key.pem"] {
                std::fs::copy(ca_dir.join(f), tls_dir.join(f)).unwrap();
            }
            let out = Command::new(PAGESTORED)
                .args(["node-id", "--cache-dir"])
                .arg(&cache_dir)
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
            let base: SocketAddr = format!("127.0.0.1:{}", ports + i as u16 * s.shards)
                .parse()
                .unwrap();
            member_lines.push_str(&format!("{id} {base} {}\n", s.shards));
            let mut args = vec![
                "--cache-dir".to_string(),
                cache_dir.display().to_string(),
                "--cache-size".into(),
                "256M".into(),
                "--page-size".into(),
                s.page_size.into(),
                "--shards".into(),
                s.shards.to_string(),
                "--listen".into(),
                base.to_string(),
                "--metadata-ttl".into(),
                s.metadata_ttl.into(),
                "--no-pin".into(),
            ];
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
                args,
            });
        }
        let members = dir.path().join("members");
        std::fs::write(&members, member_lines).unwrap();
        let mut c = Cluster {
            dir,
            ca_dir,
            members,
            nodes,
            shards: s.shards,
        };
        for i in 0..c.nodes.len() {
            c.start_node(i);
        }
        c
    }

    /// Starts node `i` and waits until it says it is ready.
    pub fn start_node(&mut self, i: usize) {
        let members = self.members.clone();
        let n = &mut self.nodes[i];
        let mut child = Command::new(PAGESTORED)
            .args(&n.args)
            .arg("--members")
            .arg(&members)
            .env("PAGESTORE_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.starts_with("ready") {
                    let _ = tx.send(());
                }
            }
        });
        if rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = child.kill();
            panic!("node {i} did not become ready: {:?}", child.wait());
        }
        n.child = Some(child);
    }

    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// Stops node `i` with SIGTERM and returns its exit status.
    pub fn terminate(&mut self, i: usize) -> std::process::ExitStatus {
        let mut c = self.nodes[i].child.take().unwrap();
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        let r = unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(r, 0);
        c.wait().unwrap()
    }

    pub fn source(&self) -> ClusterSource {
        ClusterSource::File(self.members.clone())
    }

    pub async fn client(&self, options: ClientOptions) -> Arc<Client> {
        let tls = tls::client_config(&self.ca_dir).unwrap();
        Client::connect(&self.source(), tls, None, options)
            .await
            .unwrap()
    }

    /// `(hits, misses)` summed over every shard of every running node.
    pub async fn hits_and_misses(&self, client: &Client) -> (u64, u64) {
        let pool = client_pool(&self.ca_dir).await;
        let mut total = (0, 0);
        for n in self.nodes.iter().filter(|n| n.child.is_some()) {
            for s in 0..self.shards {
                let mut a = n.base;
                a.set_port(a.port() + s);
                let req = Request {
                    request_id: 9,
                    body: RequestBody::Stat,
                };
                let (resp, _) = pool.request(a, &req, &[]).await.unwrap();
                match resp.body {
                    ResponseBody::Stat { hits, misses, .. } => {
                        total.0 += hits;
                        total.1 += misses;
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
        let _ = client;
        total
    }

    pub fn pagectl(&self, args: &[&str]) -> std::process::Output {
        Command::new(PAGECTL)
            .arg("--cluster")
            .arg(&self.members)
            .arg("--tls-dir")
            .arg(&self.ca_dir)
            .args(args)
            .output()
            .unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

pub async fn client_pool(ca_dir: &Path) -> Arc<pagestore_net::client::Pool> {
    let tls = tls::client_config(ca_dir).unwrap();
    pagestore_net::client::Pool::new(
        tls,
        "127.0.0.1:0".parse().unwrap(),
        pagestore_net::client::PoolOptions::default(),
    )
    .unwrap()
}

/// Deterministic pseudo-random bytes.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}
