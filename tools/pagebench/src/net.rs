//! The `net` target: 4 MiB page hits from a node's per-shard QUIC endpoints over loopback, with
//! the same bytes served by nginx over HTTPS at the same concurrency as the reference.

use std::{
    net::SocketAddr,
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};
use hdrhistogram::Histogram;
use pagestore_client::pool::{Pool, PoolOptions};
use pagestore_engine::{format::Geometry, EngineConfig, PageKey};
use pagestore_protocol::{
    frame::{self, FileId, Key, Request, RequestBody, ResponseBody},
    ring::{Ring, RingConfig},
    tls::{self, ClusterCa},
    transport,
};
use pagestore_server::node::{Node, NodeOptions};
use pagestore_testkit::data::{Xorshift, GOLDEN};

use crate::Opts;

/// What one side measured.
struct Side {
    name: &'static str,
    bytes: u64,
    ops: u64,
    secs: f64,
    hist: Histogram<u64>,
    server_cpu: f64,
    client_cpu: f64,
}

fn page_data(shard: u64, page: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    Xorshift::new((shard + 1).wrapping_mul(GOLDEN) ^ page).fill(&mut v);
    v
}

/// CPU seconds of this process's threads, split into (threads whose name starts with `prefix`,
/// all others).
fn thread_cpu(prefix: &str) -> (f64, f64) {
    // SAFETY: sysconf has no memory-safety preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let (mut mine, mut other) = (0.0, 0.0);
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for t in dir.flatten() {
            let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
                continue;
            };
            let (Some(l), Some(r)) = (stat.find('('), stat.rfind(')')) else {
                continue;
            };
            let name = &stat[l + 1..r];
            let f: Vec<&str> = stat[r + 2..].split_whitespace().collect();
            let cpu = f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
                + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            if name.starts_with(prefix) {
                mine += cpu / tick;
            } else {
                other += cpu / tick;
            }
        }
    }
    (mine, other)
}

/// Runs `conns` concurrent request loops for `secs`, each calling `one` and recording latency.
async fn drive<F, Fut>(conns: usize, secs: f64, one: F) -> Result<(u64, u64, Histogram<u64>, f64)>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = Result<u64>> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..conns {
        let one = one.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let (mut ops, mut bytes, mut h) = (0u64, 0u64, crate::local::new_hist());
            let mut i = c as u64;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                bytes += one(c, i).await?;
                let _ = h.record(t.elapsed().as_nanos() as u64);
                ops += 1;
                i += conns as u64;
            }
            Ok::<_, anyhow::Error>((ops, bytes, h))
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut ops, mut bytes, mut h) = (0, 0, crate::local::new_hist());
    for t in tasks {
        let (o, b, hh) = t.await??;
        ops += o;
        bytes += b;
        h.add(hh)?;
    }
    Ok((ops, bytes, h, start.elapsed().as_secs_f64()))
}

/// `pagebench net`.
pub fn run_net(o: &Opts, with_nginx: bool) -> Result<()> {
    let page = o.page_size as usize;
    let pages = (o.size / o.shards as u64 / o.page_size as u64).max(1);
    let conns = o.qd * o.shards;
    let ca = ClusterCa::generate("pagebench")?;
    let id = ca.issue("node", tls::Role::Node)?;
    let base = o.dir.join("net");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(base.join("engine"))?;

    let node = start_node(o, &base, &ca, &id, pages)?;
    let checks: Arc<Vec<Vec<u32>>> = Arc::new(
        (0..o.shards as u64)
            .map(|s| (0..pages).map(|p| crc32(&page_data(s, p, page))).collect())
            .collect(),
    );
    let addrs: Arc<Vec<SocketAddr>> = Arc::new(node.addrs().to_vec());

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(o.shards.max(1))
        .thread_name("pagebench-client")
        .enable_all()
        .build()?;
    let (quic, mtu) = quic_side(o, &ca, &addrs, &checks, pages, conns, &rt)?;
    let mut sides = vec![quic];
    drop(node);

    if with_nginx {
        sides.push(nginx_side(o, &base, &ca, &id, pages, conns, &checks, &rt)?);
    }
    print_net(o, &sides, conns, mtu);
    Ok(())
}

/// The node under test, its shards filled with `pages` pages each.
fn start_node(
    o: &Opts,
    base: &Path,
    ca: &ClusterCa,
    id: &tls::Identity,
    pages: u64,
) -> Result<Node> {
    let page = o.page_size as usize;
    let rustls = tls::server_config(id, &ca.cert_der(), false, frame::ALPN)?;
    let mut server = quinn_proto::ServerConfig::with_crypto(Arc::new(
        quinn_proto::crypto::rustls::QuicServerConfig::try_from(rustls)?,
    ));
    server.transport_config(transport::transport_config());
    let engine = EngineConfig {
        cache_dirs: vec![base.join("engine")],
        capacity: Geometry::new(o.page_size, 4096, pages as u32).file_size * o.shards as u64,
        page_size: o.page_size,
        shards: o.shards,
        queue_depth: o.qd,
        reformat: true,
        ..Default::default()
    };
    let ring = Ring::new([], RingConfig::default(), 0)?;
    let node = Node::start(
        engine,
        NodeOptions {
            listen: "127.0.0.1:0".parse()?,
            server: Arc::new(server),
            node_id: 1,
            ring: Arc::new(ring),
            max_request: 1 << 20,
            max_buffered: 16 << 20,
            limits: Default::default(),
            source: None,
            nodes: Vec::new(),
            replicas: 0,
            writeback: None,
            memory_cache: 0,
            spread: pagestore_server::spread::SpreadConfig::default(),
        },
    )?;
    let engine_ref = node.engine().context("engine gone")?;
    for s in 0..o.shards as u64 {
        for p in 0..pages {
            let data = page_data(s, p, page);
            futures_lite::future::block_on(engine_ref.shards()[s as usize].put(
                PageKey::new(s as u128, p),
                data,
                1,
            ))?;
        }
    }
    Ok(node)
}

/// The QUIC side: `conns` requests in flight from a client pool to the node's shard
/// endpoints. Returns the side and the path MTU the connection reached.
fn quic_side(
    o: &Opts,
    ca: &ClusterCa,
    addrs: &Arc<Vec<SocketAddr>>,
    checks: &Arc<Vec<Vec<u32>>>,
    pages: u64,
    conns: usize,
    rt: &tokio::runtime::Runtime,
) -> Result<(Side, u16)> {
    let page = o.page_size as usize;
    let client_tls = tls::client_config(&ca.cert_der(), None, frame::ALPN)?;
    let mut qc = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(client_tls)?,
    ));
    qc.transport_config(transport::transport_config());
    let pool = rt.block_on(async {
        Pool::new(
            qc,
            "127.0.0.1:0".parse().expect("literal"),
            PoolOptions::default(),
        )
    })?;
    let shards = o.shards;
    let (s0, c0) = thread_cpu("pagestore-shard");
    let quic = rt.block_on(drive(conns, o.seconds, {
        let (pool, addrs, checks) = (pool.clone(), addrs.clone(), checks.clone());
        move |c, i| {
            let (pool, addrs, checks) = (pool.clone(), addrs.clone(), checks.clone());
            async move {
                let shard = c % shards;
                let p = (i / shards as u64) % pages;
                let req = Request {
                    request_id: i,
                    body: RequestBody::ReadRange {
                        key: Key {
                            file_id: FileId::from_u128(shard as u128),
                            page: p,
                        },
                        offset: 0,
                        len: frame::MAX_PAGE_LEN,
                        epoch: 0,
                    },
                };
                let (resp, body) = pool
                    .request(addrs[shard], &req, bytes::Bytes::new())
                    .await?;
                if !matches!(resp.body, ResponseBody::Data { .. }) || body.len() != page {
                    bail!("bad answer {:?} ({} bytes)", resp.body, body.len());
                }
                if i % 16 == 0 && crc32(&body) != checks[shard][p as usize] {
                    bail!("shard {shard} page {p}: wrong bytes");
                }
                Ok(body.len() as u64)
            }
        }
    }))?;
    let (s1, c1) = thread_cpu("pagestore-shard");
    let mtu = rt.block_on(async {
        match pool.connection(addrs[0]).await {
            Ok(c) => c.stats().path.current_mtu,
            Err(_) => 0,
        }
    });
    let side = Side {
        name: "pagestore (QUIC)",
        bytes: quic.1,
        ops: quic.0,
        secs: quic.3,
        hist: quic.2,
        server_cpu: s1 - s0,
        client_cpu: c1 - c0,
    };
    pool.close();
    Ok((side, mtu))
}

fn print_net(o: &Opts, sides: &[Side], conns: usize, mtu: u16) {
    let page = o.page_size as usize;
    let ratio = (sides.len() == 2)
        .then(|| (sides[0].bytes as f64 / sides[0].secs) / (sides[1].bytes as f64 / sides[1].secs));
    if o.json {
        let q = |h: &Histogram<u64>, v: f64| h.value_at_quantile(v) as f64 / 1e3;
        let v: Vec<_> = sides
            .iter()
            .map(|s| {
                let gb = s.bytes as f64 / 1e9;
                serde_json::json!({
                    "side": s.name, "bytes": s.bytes, "ops": s.ops, "seconds": s.secs,
                    "bytes_per_sec": s.bytes as f64 / s.secs,
                    "latency_us": {"p50": q(&s.hist, 0.5), "p90": q(&s.hist, 0.9),
                        "p99": q(&s.hist, 0.99), "p99.9": q(&s.hist, 0.999),
                        "max": s.hist.max() as f64 / 1e3},
                    "server_cpu_seconds_per_gb": s.server_cpu / gb,
                    "client_cpu_seconds_per_gb": s.client_cpu / gb,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({"mode": "net", "shards": o.shards, "page_size": page,
                "in_flight": conns, "quic_path_mtu": mtu,
                "tls_crypto": tls::Crypto::current().to_string(), "sides": v,
                "ratio_quic_over_nginx": ratio})
        );
        return;
    }
    println!(
        "QUIC path MTU reached: {mtu} bytes; TLS crypto {} (set with {})",
        tls::Crypto::current(),
        tls::CRYPTO_ENV
    );
    println!(
        "loopback page hits: {} shards, {} KiB pages, {} requests in flight, {} s each",
        o.shards,
        page >> 10,
        conns,
        o.seconds
    );
    println!(
        "{:<18} {:>9} {:>9} {:>9} {:>9} {:>14} {:>14}",
        "", "MB/s", "p50 ms", "p99 ms", "max ms", "server CPU s/GB", "client CPU s/GB"
    );
    for s in sides {
        let gb = s.bytes as f64 / 1e9;
        println!(
            "{:<18} {:>9.1} {:>9.2} {:>9.2} {:>9.2} {:>14.3} {:>14.3}",
            s.name,
            s.bytes as f64 / s.secs / 1e6,
            s.hist.value_at_quantile(0.5) as f64 / 1e6,
            s.hist.value_at_quantile(0.99) as f64 / 1e6,
            s.hist.max() as f64 / 1e6,
            s.server_cpu / gb,
            s.client_cpu / gb,
        );
    }
    if let Some(r) = ratio {
        println!("ratio pagestore / nginx HTTPS: {r:.3} (throughput)");
    }
}

fn crc32(b: &[u8]) -> u32 {
    crc32fast::hash(b)
}

#[allow(clippy::too_many_arguments)]
fn nginx_side(
    o: &Opts,
    base: &Path,
    ca: &ClusterCa,
    id: &tls::Identity,
    pages: u64,
    conns: usize,
    checks: &Arc<Vec<Vec<u32>>>,
    rt: &tokio::runtime::Runtime,
) -> Result<Side> {
    let page = o.page_size as usize;
    let (mut child, port) = start_nginx(o, base, id, pages)?;
    std::thread::sleep(Duration::from_millis(500));
    let nginx_cpu0 = child_cpu(child.id());
    let connector = tls_connector(ca)?;
    let shards = o.shards;
    let (_, c0) = thread_cpu("pagestore-shard");
    let result = rt.block_on(async {
        // One keep-alive HTTPS connection per concurrent requester.
        let mut streams = Vec::new();
        for _ in 0..conns {
            let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
            let name = rustls::pki_types::ServerName::try_from(tls::SERVER_NAME)?;
            let s = connector.connect(name, tcp).await?;
            streams.push(Arc::new(tokio::sync::Mutex::new(s)));
        }
        let streams = Arc::new(streams);
        let checks = checks.clone();
        drive(conns, o.seconds, move |c, i| {
            let (streams, checks) = (streams.clone(), checks.clone());
            async move {
                let shard = c % shards;
                let p = (i / shards as u64) % pages;
                let mut s = streams[c].lock().await;
                let body = http_get(&mut *s, &format!("/s{shard}/p{p}")).await?;
                if body.len() != page {
                    bail!("nginx returned {} bytes", body.len());
                }
                if i % 16 == 0 && crc32(&body) != checks[shard][p as usize] {
                    bail!("nginx s{shard}/p{p}: wrong bytes");
                }
                Ok(body.len() as u64)
            }
        })
        .await
    });
    let nginx_cpu = child_cpu(child.id()) - nginx_cpu0;
    let (_, c1) = thread_cpu("pagestore-shard");
    let _ = std::process::Command::new("kill")
        .arg(child.id().to_string())
        .status();
    let _ = child.wait();
    let (ops, bytes, hist, secs) = result?;
    Ok(Side {
        name: "nginx (HTTPS)",
        bytes,
        ops,
        secs,
        hist,
        server_cpu: nginx_cpu,
        client_cpu: c1 - c0,
    })
}

/// Writes the pages as files under `base/www` and starts nginx serving them over HTTPS with
/// `id`'s certificate; returns the child and its port.
fn start_nginx(
    o: &Opts,
    base: &Path,
    id: &tls::Identity,
    pages: u64,
) -> Result<(std::process::Child, u16)> {
    let page = o.page_size as usize;
    let www = base.join("www");
    for s in 0..o.shards as u64 {
        std::fs::create_dir_all(www.join(format!("s{s}")))?;
        for p in 0..pages {
            std::fs::write(www.join(format!("s{s}/p{p}")), page_data(s, p, page))?;
        }
    }
    tls::save_identity(id, &base.join("cert.pem"), &base.join("key.pem"))?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())?
        .port();
    let conf = format!(
        "worker_processes {w};\ndaemon off;\npid {b}/nginx.pid;\nerror_log {b}/error.log;\n\
         events {{ worker_connections 1024; }}\n\
         http {{ access_log off; sendfile on; keepalive_requests 1000000; default_type application/octet-stream;\n\
           client_body_temp_path {b}/tmp; proxy_temp_path {b}/tmp; fastcgi_temp_path {b}/tmp; uwsgi_temp_path {b}/tmp; scgi_temp_path {b}/tmp;\n\
           server {{ listen 127.0.0.1:{port} ssl reuseport; ssl_certificate {b}/cert.pem; ssl_certificate_key {b}/key.pem;\n\
             ssl_protocols TLSv1.3; root {b}/www; }} }}\n",
        w = o.shards,
        b = base.display(),
    );
    std::fs::create_dir_all(base.join("tmp"))?;
    std::fs::write(base.join("nginx.conf"), conf)?;
    let child = std::process::Command::new("nginx")
        .args([
            "-c",
            &base.join("nginx.conf").display().to_string(),
            "-p",
            &base.display().to_string(),
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| {
            anyhow!("cannot start nginx ({e}); install it (Debian: apt-get install nginx-light)")
        })?;
    Ok((child, port))
}

/// A TLS 1.3 connector that trusts the cluster CA.
fn tls_connector(ca: &ClusterCa) -> Result<tokio_rustls::TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert_der())?;
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(cfg)))
}

/// CPU seconds of a process and its children (nginx master and workers).
fn child_cpu(pid: u32) -> f64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut total = 0.0;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    for e in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some(r) = stat.rfind(')') else { continue };
        let f: Vec<&str> = stat[r + 2..].split_whitespace().collect();
        let me = e.file_name().to_string_lossy().parse::<u32>().ok();
        let ppid = f.get(1).and_then(|v| v.parse::<u32>().ok());
        if me == Some(pid) || ppid == Some(pid) {
            total += f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
                + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        }
    }
    total / tick
}

async fn http_get<S>(s: &mut S, path: &str) -> Result<Vec<u8>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: pagestore\r\n\r\n").as_bytes())
        .await?;
    s.flush().await?;
    let mut head = Vec::with_capacity(512);
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut b).await?;
        if n == 0 || head.len() > 16 << 10 {
            bail!("connection closed in headers after {} bytes", head.len());
        }
        head.push(b[0]);
    }
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    if !text.starts_with("http/1.1 200") {
        bail!("nginx: {}", text.lines().next().unwrap_or_default());
    }
    let len = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>())
        })
        .context("no content-length")??;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await?;
    Ok(body)
}
