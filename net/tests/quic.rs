//! Per-shard QUIC endpoints on loopback, driven by quinn-proto on glommio, against a quinn
//! (tokio) client: pages read byte-exact over many concurrent streams, each request served by the
//! shard whose port it reached, mutual TLS refusing clients without a cluster certificate, and a
//! connection dropped mid-transfer giving the client an error instead of a hang.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::{
    future::Future,
    net::SocketAddr,
    pin::Pin,
    rc::Rc,
    sync::{mpsc, Arc, Mutex},
    time::Duration,
};

use pagestore_engine::{format::Geometry, Engine, EngineConfig, PageKey, Shard};
use pagestore_net::{
    endpoint::{self, Body, EndpointHandle, EndpointOptions, Reply, Service},
    tls::{self, ClusterCa, Identity},
    transport,
};

const ALPN: &[u8] = b"pagestore-test/1";
const PAGE: u32 = 256 * 1024;

/// Test protocol: request = file id (16 bytes LE) + page (8 bytes LE) [+ "CLOSE"]; reply head =
/// shard id (1 byte) + found (1 byte) + length (4 bytes LE), body = the page.
struct PageService {
    shard: Rc<Shard>,
    endpoint: Rc<std::cell::RefCell<Option<Rc<EndpointHandle>>>>,
}

impl Service for PageService {
    fn call(self: Rc<Self>, request: Vec<u8>) -> Pin<Box<dyn Future<Output = Reply>>> {
        Box::pin(async move {
            let bad = || Reply {
                head: vec![self.shard.id() as u8, 2, 0, 0, 0, 0],
                body: Body::Empty,
            };
            if request.len() < 24 {
                return bad();
            }
            let file = u128::from_le_bytes(request[..16].try_into().unwrap());
            let page = u64::from_le_bytes(request[16..24].try_into().unwrap());
            if &request[24..] == b"CLOSE" {
                // Drop every connection while replies are in flight.
                let ep = self.endpoint.borrow().clone();
                if let Some(ep) = ep {
                    glommio::spawn_local(async move { ep.close().await }).detach();
                }
            }
            match self.shard.get(&PageKey::new(file, page), 0, u32::MAX).await {
                Ok(Some(data)) => {
                    let mut head = vec![self.shard.id() as u8, 1];
                    head.extend_from_slice(&(data.len() as u32).to_le_bytes());
                    Reply {
                        head,
                        body: Body::Page(data),
                    }
                }
                _ => bad(),
            }
        })
    }
}

struct Cluster {
    engine: Engine,
    addrs: Vec<SocketAddr>,
    ca: ClusterCa,
    _dir: tempfile::TempDir,
}

fn page_bytes(file: u128, page: u64) -> Vec<u8> {
    let mut x = file as u64 ^ page.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x1234;
    (0..PAGE as usize / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}

fn cluster(require_client_cert: bool) -> Cluster {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let ca = ClusterCa::generate("test cluster").unwrap();
    let node = ca.issue("node-1").unwrap();
    let rustls = tls::server_config(&node, &ca.cert_der(), require_client_cert, ALPN).unwrap();
    let mut server = quinn_proto::ServerConfig::with_crypto(Arc::new(
        quinn_proto::crypto::rustls::QuicServerConfig::try_from(rustls).unwrap(),
    ));
    server.transport_config(transport::transport_config());
    let server = Arc::new(server);
    let (tx, rx) = mpsc::channel::<(usize, SocketAddr)>();
    let tx = Arc::new(Mutex::new(tx));
    let init: pagestore_engine::ShardInit = Arc::new(move |shard: Rc<Shard>| {
        let slot = Rc::new(std::cell::RefCell::new(None));
        let service = Rc::new(PageService {
            shard: shard.clone(),
            endpoint: slot.clone(),
        });
        let opts = EndpointOptions {
            addr: "127.0.0.1:0".parse().unwrap(),
            server: server.clone(),
            max_request: 1 << 20,
        };
        let ep = Rc::new(endpoint::start(opts, service).unwrap());
        tx.lock()
            .unwrap()
            .send((shard.id(), ep.local_addr()))
            .unwrap();
        *slot.borrow_mut() = Some(ep.clone());
        // Keep the endpoint alive as long as the shard runs.
        std::mem::forget(ep);
    });
    let file = Geometry::new(PAGE, 4096, 64).file_size;
    let cfg = EngineConfig {
        cache_dirs: vec![dir.path().to_path_buf()],
        capacity: file * 2,
        page_size: PAGE,
        shards: 2,
        pin_cpus: false,
        queue_depth: 4,
        ..Default::default()
    };
    let engine = Engine::start_with(cfg, Some(init)).unwrap();
    let mut addrs = vec![None, None];
    for _ in 0..2 {
        let (id, addr) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        addrs[id] = Some(addr);
    }
    // Two pages on each shard.
    futures_lite::future::block_on(async {
        for s in 0..2u64 {
            for p in 0..2u64 {
                let file = 100 + s as u128;
                engine.shards()[s as usize]
                    .put(PageKey::new(file, p), page_bytes(file, p), 1)
                    .await
                    .unwrap();
            }
        }
    });
    Cluster {
        engine,
        addrs: addrs.into_iter().map(Option::unwrap).collect(),
        ca,
        _dir: dir,
    }
}

fn client(ca: &ClusterCa, identity: Option<&Identity>) -> quinn::Endpoint {
    let rustls = tls::client_config(&ca.cert_der(), identity, ALPN).unwrap();
    let mut cfg = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(rustls).unwrap(),
    ));
    cfg.transport_config(transport::transport_config());
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(cfg);
    ep
}

async fn request(
    conn: &quinn::Connection,
    file: u128,
    page: u64,
    extra: &[u8],
) -> Result<(u8, u8, Vec<u8>), String> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
    let mut req = file.to_le_bytes().to_vec();
    req.extend_from_slice(&page.to_le_bytes());
    req.extend_from_slice(extra);
    send.write_all(&req).await.map_err(|e| e.to_string())?;
    send.finish().map_err(|e| e.to_string())?;
    let all = recv
        .read_to_end(16 << 20)
        .await
        .map_err(|e| e.to_string())?;
    if all.len() < 6 {
        return Err(format!("short reply: {} bytes", all.len()));
    }
    let len = u32::from_le_bytes(all[2..6].try_into().unwrap()) as usize;
    if all.len() != 6 + len {
        return Err(format!(
            "reply of {} bytes, header says {len}",
            all.len() - 6
        ));
    }
    Ok((all[0], all[1], all[6..].to_vec()))
}

fn tokio() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn pages_byte_exact_over_many_streams_each_served_by_its_shard() {
    let c = cluster(false);
    let node = c.ca.issue("client").unwrap();
    tokio().block_on(async {
        let ep = client(&c.ca, Some(&node));
        for (shard, addr) in c.addrs.iter().enumerate() {
            let conn = ep.connect(*addr, tls::SERVER_NAME).unwrap().await.unwrap();
            // 64 concurrent requests on one connection, all pages of this shard plus misses.
            let mut tasks = Vec::new();
            for i in 0..64u64 {
                let conn = conn.clone();
                let file = 100 + shard as u128;
                tasks.push(tokio::spawn(async move {
                    let page = i % 3; // page 2 does not exist
                    (page, request(&conn, file, page, b"").await)
                }));
            }
            for t in tasks {
                let (page, r) = t.await.unwrap();
                let (served_by, found, body) = r.unwrap();
                assert_eq!(
                    served_by as usize, shard,
                    "request reached port of shard {shard}"
                );
                if page == 2 {
                    assert_eq!((found, body.len()), (2, 0));
                } else {
                    assert_eq!(found, 1);
                    assert!(
                        body == page_bytes(100 + shard as u128, page),
                        "page {page} differs"
                    );
                }
            }
        }
        ep.wait_idle().await;
    });
    let stats = futures_lite::future::block_on(c.engine.stats()).unwrap();
    for s in &stats {
        assert!(s.hits >= 42, "shard {} served {} hits", s.shard, s.hits);
    }
}

#[test]
fn mutual_tls_refuses_clients_without_a_cluster_certificate() {
    let c = cluster(true);
    tokio().block_on(async {
        // No client certificate at all.
        let ep = client(&c.ca, None);
        let r = async {
            let conn = ep
                .connect(c.addrs[0], tls::SERVER_NAME)
                .unwrap()
                .await
                .map_err(|e| e.to_string())?;
            request(&conn, 100, 0, b"").await
        };
        let r = tokio::time::timeout(Duration::from_secs(10), r)
            .await
            .expect("no hang");
        assert!(r.is_err(), "a client without a certificate read a page");

        // A certificate from another CA.
        let other = ClusterCa::generate("intruder").unwrap();
        let fake = other.issue("intruder").unwrap();
        let ep2 = client(&c.ca, Some(&fake));
        let r = async {
            let conn = ep2
                .connect(c.addrs[0], tls::SERVER_NAME)
                .unwrap()
                .await
                .map_err(|e| e.to_string())?;
            request(&conn, 100, 0, b"").await
        };
        let r = tokio::time::timeout(Duration::from_secs(10), r)
            .await
            .expect("no hang");
        assert!(
            r.is_err(),
            "a client with a foreign certificate read a page"
        );

        // A cluster certificate works.
        let good = c.ca.issue("client").unwrap();
        let ep3 = client(&c.ca, Some(&good));
        let conn = ep3
            .connect(c.addrs[0], tls::SERVER_NAME)
            .unwrap()
            .await
            .unwrap();
        let (_, found, body) = request(&conn, 100, 0, b"").await.unwrap();
        assert_eq!((found, body == page_bytes(100, 0)), (1, true));
    });
}

#[test]
fn a_connection_dropped_mid_transfer_is_an_error_not_a_hang() {
    let c = cluster(false);
    tokio().block_on(async {
        let ep = client(&c.ca, None);
        let conn = ep
            .connect(c.addrs[1], tls::SERVER_NAME)
            .unwrap()
            .await
            .unwrap();
        let mut tasks = Vec::new();
        for i in 0..32u64 {
            let conn = conn.clone();
            tasks.push(tokio::spawn(async move {
                request(&conn, 101, i % 2, b"").await
            }));
        }
        // This request makes the server close every connection while the others are in flight.
        let closing = request(&conn, 101, 0, b"CLOSE");
        let all = async {
            let _ = closing.await;
            let mut errors = 0;
            for t in tasks {
                if t.await.unwrap().is_err() {
                    errors += 1;
                }
            }
            errors
        };
        let errors = tokio::time::timeout(Duration::from_secs(20), all)
            .await
            .expect("client hung");
        // Whatever had not completed when the server closed failed, rather than hanging.
        let after = request(&conn, 101, 0, b"").await;
        assert!(after.is_err(), "the connection should be closed");
        let _ = errors;
    });
}
