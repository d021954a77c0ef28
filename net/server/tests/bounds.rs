//! What one peer can make a shard endpoint hold, and for how long, over real QUIC on loopback:
//! the node's request budget against many connections that never finish their requests
//! (measured on a node running in a child process: its RSS and its own counter), the
//! per-address connection limit, the stall timeout, Retry under a forced high handshake rate,
//! and the message a client gets when a node refuses it for lack of a client certificate.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::{
    io::{BufRead, BufReader, Write},
    net::SocketAddr,
    path::Path,
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use common::{client_config, pool, MAX_REQUEST};
use pagestore_client::pool::Pool;
use pagestore_engine::PageKey;
use pagestore_protocol::{
    frame::{self, FileId, Key, Request, RequestBody, ResponseBody},
    tls::{self, ClusterCa},
    transport,
};
use pagestore_server::{
    endpoint::Limits,
    node::{EndpointCounters, Node, NodeOptions},
};

const PAGE: u32 = 256 * 1024;

/// The bytes of a whole page of `file` (version 1).
fn page_bytes(file: u128, page: u64) -> Vec<u8> {
    common::page_bytes(file, page, PAGE)
}

struct TestNode {
    node: Node,
    _dir: tempfile::TempDir,
}

/// A two-shard node with one cached page (file 100, page 0) on shard 0.
fn start_node(ca: &ClusterCa, require_client_cert: bool, limits: Limits) -> TestNode {
    let dir = common::tempdir();
    let server = common::server_config(ca, require_client_cert);
    let node = Node::start(
        common::engine_config(dir.path(), PAGE, 128, 2),
        NodeOptions {
            max_buffered: 2 * MAX_REQUEST,
            limits,
            ..common::node_options(server, 0xB0B, common::no_ring())
        },
    )
    .unwrap();
    futures_lite::future::block_on(node.engine().unwrap().shards()[0].put(
        PageKey::new(100, 0),
        page_bytes(100, 0),
        1,
    ))
    .unwrap();
    TestNode { node, _dir: dir }
}

/// A bare quinn endpoint (each `connect` is a new connection).
fn endpoint(ca: &ClusterCa, bind: &str) -> quinn::Endpoint {
    let socket = std::net::UdpSocket::bind(bind).unwrap();
    let mut e = quinn::Endpoint::new(
        transport::endpoint_config(),
        None,
        socket,
        quinn::default_runtime().unwrap(),
    )
    .unwrap();
    e.set_default_client_config(client_config(ca, None));
    e
}

async fn read_page(pool: &Pool, addr: SocketAddr) -> Result<Vec<u8>, String> {
    let req = Request {
        request_id: 1,
        body: RequestBody::ReadRange {
            key: Key {
                file_id: FileId::from_u128(100),
                page: 0,
            },
            offset: 0,
            len: frame::MAX_PAGE_LEN,
            epoch: 0,
        },
    };
    match pool.request(addr, &req, bytes::Bytes::new()).await {
        Ok((r, body)) if matches!(r.body, ResponseBody::Data { .. }) => Ok(body.to_vec()),
        Ok((r, _)) => Err(format!("{:?}", r.body)),
        Err(e) => Err(e.to_string()),
    }
}

async fn write_page(pool: &Pool, addr: SocketAddr, page: u64) -> ResponseBody {
    let data = page_bytes(300, page);
    let req = Request {
        request_id: page,
        body: RequestBody::WritePage {
            key: Key {
                file_id: FileId::from_u128(300),
                page,
            },
            version: 1,
            len: data.len() as u32,
            epoch: 0,
        },
    };
    pool.request(addr, &req, bytes::Bytes::copy_from_slice(&data))
        .await
        .unwrap()
        .0
        .body
}

fn tokio() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn counters(node: &Node) -> EndpointCounters {
    let all = futures_lite::future::block_on(node.endpoint_counters()).unwrap();
    all.iter()
        .fold(EndpointCounters::default(), |a, c| EndpointCounters {
            connections: a.connections + c.connections,
            refused: a.refused + c.refused,
            retries: a.retries + c.retries,
            stalled: a.stalled + c.stalled,
            budget_waits: a.budget_waits + c.budget_waits,
            rejected: a.rejected + c.rejected,
            payloads_apart: a.payloads_apart + c.payloads_apart,
        })
}

// ---- memory under stalling connections: the node runs in a child process ----

/// Budget of the child node: far below what the attack below would make an unbounded node
/// hold (60 connections x 4 requests x 960 KB = 230 MB).
const CHILD_BUDGET: usize = 8 << 20;
const ATTACKERS: usize = 60;
const STREAMS_EACH: usize = 4;

/// The child: a node whose endpoint limits are those of the memory test. It prints its address
/// and, for every line read from stdin, its request-byte counter; it stops at end of input.
#[test]
#[ignore = "started by stalling_connections_cannot_grow_node_memory_beyond_its_bound"]
fn child_node() {
    let Ok(dir) = std::env::var("PAGESTORE_BOUNDS_CHILD") else {
        return;
    };
    let dir = Path::new(&dir);
    let ca = ClusterCa::load(&dir.join("ca.pem"), &dir.join("ca.key")).unwrap();
    let t = start_node(
        &ca,
        false,
        Limits {
            max_partial_bytes: CHILD_BUDGET,
            max_connections_per_ip: 1000,
            request_stall_timeout: Duration::from_secs(60),
            ..Limits::default()
        },
    );
    println!("ADDR {}", t.node.addrs()[0]);
    for line in std::io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
        let c = counters(&t.node);
        println!(
            "STATS {} {} {} {}",
            t.node.partial_bytes(),
            c.stalled,
            c.budget_waits,
            t.node.reply_bytes()
        );
    }
    t.node.shutdown().unwrap();
}

struct Child {
    proc: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Child {
    fn line(&mut self, prefix: &str) -> String {
        loop {
            let mut l = String::new();
            assert!(self.out.read_line(&mut l).unwrap() > 0, "child node ended");
            if let Some(rest) = l.strip_prefix(prefix) {
                return rest.trim().to_string();
            }
        }
    }

    /// (request bytes held, requests reset as stalled, budget waits)
    fn stats(&mut self) -> (usize, u64, u64) {
        let v = self.all_stats();
        (v[0] as usize, v[1], v[2])
    }

    /// Request bytes held, requests reset as stalled, budget waits, reply bytes held.
    fn all_stats(&mut self) -> Vec<u64> {
        writeln!(self.proc.stdin.as_mut().unwrap(), "stats").unwrap();
        let l = self.line("STATS ");
        l.split(' ').map(|x| x.parse().unwrap()).collect()
    }

    fn rss(&self) -> usize {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.proc.id())).unwrap();
        let kb: usize = s
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .unwrap()
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap();
        kb << 10
    }
}

/// Starts the child node (see [`child_node`]) with a CA saved in `dir`.
fn start_child(dir: &Path) -> (Child, ClusterCa, SocketAddr) {
    let ca = ClusterCa::generate(tls::CA_NAME).unwrap();
    ca.save(&dir.join("ca.pem"), &dir.join("ca.key")).unwrap();
    let mut proc = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_node", "--ignored", "--nocapture"])
        .env("PAGESTORE_BOUNDS_CHILD", dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(proc.stdout.take().unwrap());
    let mut child = Child { proc, out };
    let addr: SocketAddr = child.line("ADDR ").parse().unwrap();
    (child, ca, addr)
}

/// What an attack wave did to the node ([`attack_wave`]).
struct Wave {
    /// The node's largest resident size seen during the wave.
    peak: usize,
    /// The most request bytes the node held at once.
    held_max: usize,
    /// Requests that waited for the budget (the node's count, since its start).
    waits: u64,
    /// How long an honest read took during the wave.
    served: Duration,
}

/// 60 connections, each starting 4 requests of 960 KB and never finishing them, held for 2 s
/// while the node's memory and held bytes are sampled and an honest client reads a page; then
/// the attackers leave, and every byte held for them must be given back within 10 s.
fn attack_wave(
    rt: &tokio::runtime::Runtime,
    ca: &ClusterCa,
    addr: SocketAddr,
    child: &mut Child,
    honest: &Pool,
) -> Wave {
    // The send streams are kept (dropping one would finish its request).
    let (attack, _conns, _streams) = rt.block_on(async {
        let ep = endpoint(ca, "127.0.0.1:0");
        let mut conns = Vec::new();
        let mut streams = Vec::new();
        for _ in 0..ATTACKERS {
            let c = ep.connect(addr, tls::SERVER_NAME).unwrap().await.unwrap();
            for _ in 0..STREAMS_EACH {
                let (mut send, recv) = c.open_bi().await.unwrap();
                // quinn takes what the node's flow control allows; the rest would wait.
                let data = vec![0x5A; 960_000];
                let _ =
                    tokio::time::timeout(Duration::from_millis(20), send.write_all(&data)).await;
                streams.push((send, recv));
            }
            conns.push(c);
        }
        (ep, conns, streams)
    });
    // While the attack holds: the counter stays within the budget, and an honest client is
    // served.
    let mut peak = 0;
    let mut held_max = 0;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(2) {
        let (held, stalled, _) = child.stats();
        assert_eq!(stalled, 0, "requests reset before the stall timeout");
        held_max = held_max.max(held);
        peak = peak.max(child.rss());
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, _, waits) = child.stats();
    let served = Instant::now();
    rt.block_on(async {
        assert_eq!(read_page(honest, addr).await.unwrap(), page_bytes(100, 0));
    });
    let served = served.elapsed();
    attack.close(0u32.into(), b"bye");
    drop((_conns, _streams));
    let t = Instant::now();
    while child.stats().0 != 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "request bytes still held after the attackers left"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Wave {
        peak,
        held_max,
        waits,
        served,
    }
}

#[test]
fn stalling_connections_cannot_grow_node_memory_beyond_its_bound() {
    let dir = common::tempdir();
    let (mut child, ca, addr) = start_child(dir.path());
    let rt = tokio();
    let _guard = rt.enter();
    let honest = pool(
        &ca,
        Some(&ca.issue("honest", tls::Role::Writer).unwrap()),
        "127.0.0.1:0",
    );
    rt.block_on(async {
        assert_eq!(read_page(&honest, addr).await.unwrap(), page_bytes(100, 0));
    });
    std::thread::sleep(Duration::from_millis(300));
    let before = child.rss();

    let first = attack_wave(&rt, &ca, addr, &mut child, &honest);
    // The bound: the budget, plus per connection its base receive window (unread in
    // quinn-proto) and its own allowance, twice over for allocator and QUIC overheads, plus
    // 32 MiB for everything else a connection costs.
    let per_conn =
        transport::SERVER_BASE_WINDOW as usize + pagestore_server::endpoint::CONNECTION_ALLOWANCE;
    let bound = CHILD_BUDGET + 2 * ATTACKERS * per_conn + (32 << 20);
    let grown = first.peak.saturating_sub(before);
    eprintln!(
        "child RSS before {} MiB, peak {} MiB (+{} MiB, bound {} MiB), request bytes held at \
         most {} KiB, budget waits {}, honest read during the attack {:?}",
        before >> 20,
        first.peak >> 20,
        grown >> 20,
        bound >> 20,
        first.held_max >> 10,
        first.waits,
        first.served
    );
    assert!(
        first.held_max <= CHILD_BUDGET,
        "held {} > budget",
        first.held_max
    );
    assert!(
        first.held_max >= CHILD_BUDGET / 2,
        "the attack did not reach the budget"
    );
    assert!(first.waits > 0, "no request waited for the budget");
    assert!(grown <= bound, "RSS grew by {grown} bytes, bound {bound}");
    assert!(
        first.served < Duration::from_secs(2),
        "honest read took {:?}",
        first.served
    );
    // A full-size write from an honest client goes through once the attackers left.
    rt.block_on(async {
        assert_eq!(write_page(&honest, addr, 1).await, ResponseBody::Written);
    });

    // What the attackers' connections took is given back: a second wave as large grows the
    // node no further than a fraction of what the first did. (The resident size itself need
    // not fall when they leave: the allocator keeps freed pages for reuse, and whether it
    // trims them depends on fragmentation; a CI run kept 16 of 21 MiB. Kept connection state
    // would add the whole growth again.)
    let second = attack_wave(&rt, &ca, addr, &mut child, &honest);
    eprintln!(
        "second wave: peak {} MiB (the first {} MiB); RSS now {} MiB",
        second.peak >> 20,
        first.peak >> 20,
        child.rss() >> 20
    );
    assert!(
        second.peak <= first.peak + grown / 2,
        "the first wave's memory was not given back: peak {} then {}, before {before}",
        first.peak,
        second.peak
    );
    honest.close();
    drop(child.proc.stdin.take());
    let status = child.proc.wait().unwrap();
    assert!(status.success(), "child node failed: {status}");
}

/// Opens `conns` connections that each send `reads` reads of page (100, 0) and never take the
/// replies: their flow-control windows let the node send 1 KiB per stream.
fn non_reading_attack(
    ca: &ClusterCa,
    addr: SocketAddr,
    conns: usize,
    reads: usize,
) -> (
    quinn::Endpoint,
    Vec<quinn::Connection>,
    Vec<(quinn::SendStream, quinn::RecvStream)>,
) {
    let mut head = Vec::new();
    let req = Request {
        request_id: 1,
        body: RequestBody::ReadRange {
            key: Key {
                file_id: FileId::from_u128(100),
                page: 0,
            },
            offset: 0,
            len: frame::MAX_PAGE_LEN,
            epoch: 0,
        },
    };
    frame::encode_request(&req, 0, &mut head).unwrap();
    let mut cfg = client_config(ca, None);
    let mut t = quinn::TransportConfig::default();
    t.stream_receive_window(1024u32.into())
        .receive_window((64u32 << 10).into())
        .max_concurrent_bidi_streams(0u32.into());
    cfg.transport_config(Arc::new(t));
    let ep = endpoint(ca, "127.0.0.1:0");
    let mut live = Vec::new();
    let mut streams = Vec::new();
    tokio::runtime::Handle::current().block_on(async {
        for _ in 0..conns {
            let c = ep
                .connect_with(cfg.clone(), addr, tls::SERVER_NAME)
                .unwrap()
                .await
                .unwrap();
            for _ in 0..reads {
                let (mut send, recv) = c.open_bi().await.unwrap();
                send.write_all(&head).await.unwrap();
                send.finish().unwrap();
                streams.push((send, recv));
            }
            live.push(c);
        }
    });
    (ep, live, streams)
}

#[test]
fn readers_that_never_take_their_replies_cannot_grow_node_memory_beyond_its_bound() {
    // 6 connections x 160 reads of a 256 KiB page: an unbounded node would hold 240 MiB of
    // replies. Each connection may hold an eighth of the budget (1 MiB): the attack reaches
    // half of it, and the rest stays for readers that take their replies.
    let dir = common::tempdir();
    let (mut child, ca, addr) = start_child(dir.path());
    let rt = tokio();
    let _guard = rt.enter();
    let honest = pool(&ca, None, "127.0.0.1:0");
    rt.block_on(async {
        assert_eq!(read_page(&honest, addr).await.unwrap(), page_bytes(100, 0));
    });
    std::thread::sleep(Duration::from_millis(300));
    let before = child.rss();
    let (attack, conns, streams) = std::thread::scope(|s| {
        s.spawn(|| {
            let _g = rt.enter();
            non_reading_attack(&ca, addr, 6, 160)
        })
        .join()
        .unwrap()
    });
    let mut peak = 0;
    let mut held_max = 0;
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(1500) {
        held_max = held_max.max(child.all_stats()[3] as usize);
        peak = peak.max(child.rss());
        std::thread::sleep(Duration::from_millis(100));
    }
    // An honest reader is served while the attackers hold their streams.
    let served = Instant::now();
    rt.block_on(async {
        assert_eq!(read_page(&honest, addr).await.unwrap(), page_bytes(100, 0));
    });
    let served = served.elapsed();
    let per_conn =
        transport::SERVER_BASE_WINDOW as usize + pagestore_server::endpoint::CONNECTION_ALLOWANCE;
    let bound = CHILD_BUDGET + 2 * 6 * per_conn + (32 << 20);
    let grown = peak.saturating_sub(before);
    eprintln!(
        "child RSS before {} MiB, peak {} MiB (+{} MiB, bound {} MiB), reply bytes held at most \
         {} KiB, honest read during the attack {served:?}",
        before >> 20,
        peak >> 20,
        grown >> 20,
        bound >> 20,
        held_max >> 10,
    );
    assert!(held_max <= CHILD_BUDGET, "held {held_max} > budget");
    assert!(
        held_max >= CHILD_BUDGET / 2,
        "the attack did not reach half the budget"
    );
    assert!(grown <= bound, "RSS grew by {grown} bytes, bound {bound}");
    assert!(
        served < Duration::from_secs(2),
        "honest read took {served:?}"
    );

    // Enough connections to fill the whole budget: replies that stopped moving are reset once
    // someone waits for the budget (after a second, not the child's 60 s stall timeout), and
    // the honest reader is served again.
    let more = std::thread::scope(|s| {
        s.spawn(|| {
            let _g = rt.enter();
            non_reading_attack(&ca, addr, 16, 8)
        })
        .join()
        .unwrap()
    });
    std::thread::sleep(Duration::from_millis(500));
    let served = Instant::now();
    rt.block_on(async {
        assert_eq!(read_page(&honest, addr).await.unwrap(), page_bytes(100, 0));
    });
    let served = served.elapsed();
    let reset = child.all_stats()[1];
    eprintln!("budget filled: honest read after {served:?}, {reset} replies reset");
    assert!(reset > 0, "no reply was reset");
    assert!(
        served < Duration::from_secs(30),
        "honest read took {served:?}"
    );

    for ep in [&attack, &more.0] {
        ep.close(0u32.into(), b"bye");
    }
    drop((conns, streams, more));
    let t = Instant::now();
    while child.all_stats()[3] != 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "reply bytes still held after the attackers left"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    honest.close();
    drop(child.proc.stdin.take());
    let status = child.proc.wait().unwrap();
    assert!(status.success(), "child node failed: {status}");
}

#[test]
fn connection_beyond_the_per_address_limit_is_refused() {
    let ca = ClusterCa::generate("bounds").unwrap();
    let t = start_node(
        &ca,
        false,
        Limits {
            max_connections_per_ip: 3,
            ..Limits::default()
        },
    );
    let addr = t.node.addrs()[0];
    tokio().block_on(async {
        let ep = endpoint(&ca, "127.0.0.1:0");
        let mut conns = Vec::new();
        for _ in 0..3 {
            conns.push(ep.connect(addr, tls::SERVER_NAME).unwrap().await.unwrap());
        }
        let fourth = ep.connect(addr, tls::SERVER_NAME).unwrap().await;
        match fourth {
            Err(quinn::ConnectionError::ConnectionClosed(c)) => assert_eq!(
                c.error_code,
                quinn::TransportErrorCode::CONNECTION_REFUSED,
                "{c:?}"
            ),
            other => panic!("fourth connection from one address: {other:?}"),
        }
        // A client pool refused the same way says why.
        let p = pool(&ca, None, "127.0.0.1:0");
        let e = read_page(&p, addr).await.unwrap_err();
        assert!(e.contains("refused the connection"), "{e}");
        // Another address is not counted against this one.
        let other = pool(&ca, None, "127.0.0.2:0");
        assert_eq!(read_page(&other, addr).await.unwrap(), page_bytes(100, 0));
        // A connection that leaves frees its place.
        conns.pop().unwrap().close(0u32.into(), b"done");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let again = ep.connect(addr, tls::SERVER_NAME).unwrap().await;
        assert!(again.is_ok(), "{again:?}");
        let c = counters(&t.node);
        assert_eq!(c.refused, 2, "{c:?}");
    });
}

/// A node whose requests stall after 1 s.
fn quick_stall_node(ca: &ClusterCa) -> TestNode {
    start_node(
        ca,
        false,
        Limits {
            request_stall_timeout: Duration::from_secs(1),
            ..Limits::default()
        },
    )
}

/// Waits (5 s at most) for the node to reset the request stream whose answer `recv` reads.
async fn assert_reset_within_5s(recv: &mut quinn::RecvStream) {
    let r = tokio::time::timeout(Duration::from_secs(5), recv.read_to_end(1 << 20))
        .await
        .expect("a stalled request was not reset within 5 s");
    assert!(
        matches!(
            r,
            Err(quinn::ReadToEndError::Read(quinn::ReadError::Reset(_)))
        ),
        "{r:?}"
    );
}

#[test]
fn a_stalled_request_is_reset_and_its_bytes_freed() {
    let ca = ClusterCa::generate("bounds").unwrap();
    let t = quick_stall_node(&ca);
    let addr = t.node.addrs()[0];
    tokio().block_on(async {
        let ep = endpoint(&ca, "127.0.0.1:0");
        let conn = ep.connect(addr, tls::SERVER_NAME).unwrap().await.unwrap();
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(&[7u8; 300_000]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            t.node.partial_bytes() > 0,
            "the request's bytes are not counted"
        );
        let started = Instant::now();
        assert_reset_within_5s(&mut recv).await;
        assert!(started.elapsed() >= Duration::from_millis(500));
        assert_eq!(
            t.node.partial_bytes(),
            0,
            "the stalled request's bytes are held"
        );
        assert_eq!(counters(&t.node).stalled, 1);
        // The connection itself goes on serving.
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        let mut head = Vec::new();
        let req = Request {
            request_id: 9,
            body: RequestBody::ReadRange {
                key: Key {
                    file_id: FileId::from_u128(100),
                    page: 0,
                },
                offset: 0,
                len: 10,
                epoch: 0,
            },
        };
        frame::encode_request(&req, 0, &mut head).unwrap();
        send.write_all(&head).await.unwrap();
        send.finish().unwrap();
        let reply = recv.read_to_end(1 << 20).await.unwrap();
        let (resp, range) = frame::decode_response_frame(&reply).unwrap();
        assert!(matches!(resp.body, ResponseBody::Data { .. }), "{resp:?}");
        assert_eq!(&reply[range], &page_bytes(100, 0)[..10]);
    });
}

/// Sends `parts` on one stream, pausing between them so that they arrive apart, finishes it
/// and returns the answer's head and payload.
async fn send_in_parts(conn: &quinn::Connection, parts: &[&[u8]]) -> (ResponseBody, Vec<u8>) {
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    for part in parts {
        send.write_all(part).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    send.finish().unwrap();
    let reply = recv.read_to_end(1 << 20).await.unwrap();
    let (resp, range) = frame::decode_response_frame(&reply).unwrap();
    (resp.body, reply[range].to_vec())
}

/// The head of a `WritePage` of page `page` of file 400, announcing `len` payload bytes.
fn write_page_head(page: u64, len: u32) -> Vec<u8> {
    let req = Request {
        request_id: page,
        body: RequestBody::WritePage {
            key: Key {
                file_id: FileId::from_u128(400),
                page,
            },
            version: 1,
            len,
            epoch: 0,
        },
    };
    let mut head = Vec::new();
    frame::encode_request(&req, len, &mut head).unwrap();
    head
}

/// A written page is received straight into a buffer aligned for the disk (counted), whatever
/// pieces its frame arrives in, and stored byte-exact; a frame whose payload is shorter or
/// longer than it announced is answered with a clear error and stores nothing, and the node
/// holds no request bytes afterwards. Small payloads follow the head as before. A page whose
/// bytes stop arriving is reset after the stall timeout and its buffer's charge given back.
#[test]
fn written_pages_are_received_apart_and_bad_lengths_are_answered_clearly() {
    let ca = ClusterCa::generate("bounds").unwrap();
    let t = quick_stall_node(&ca);
    let addr = t.node.addrs()[0];
    let writer = ca.issue("writer", tls::Role::Writer).unwrap();
    let stored = |page: u64| {
        futures_lite::future::block_on(t.node.engine().unwrap().shards()[0].get(
            PageKey::new(400, page),
            0,
            PAGE,
        ))
        .unwrap()
    };
    tokio().block_on(async {
        let mut ep = endpoint(&ca, "127.0.0.1:0");
        ep.set_default_client_config(client_config(&ca, Some(&writer)));
        let conn = ep.connect(addr, tls::SERVER_NAME).unwrap().await.unwrap();
        // The preamble in two pieces, the rest of the head with the payload's first bytes.
        let page = page_bytes(400, 0);
        let head = write_page_head(0, PAGE);
        let (a, b) = head.split_at(7);
        let mut rest = b.to_vec();
        rest.extend_from_slice(&page[..1000]);
        let got = send_in_parts(&conn, &[a, &rest, &page[1000..]]).await;
        assert_eq!(got.0, ResponseBody::Written);
        assert_eq!(counters(&t.node).payloads_apart, 1);
        assert!(stored(0).unwrap() == page, "page 0 not stored byte-exact");

        // One byte short of what the frame announced.
        let page1 = page_bytes(400, 1);
        let (body, _) = send_in_parts(
            &conn,
            &[&write_page_head(1, PAGE), &page1[..PAGE as usize - 1]],
        )
        .await;
        let ResponseBody::Error { code, message } = body else {
            panic!("{body:?}")
        };
        assert_eq!(code, frame::ErrorCode::BadRequest);
        assert!(message.contains("truncated frame"), "{message}");
        // More than it announced: the bytes past the buffer are dropped, and counted.
        let mut long = page1.clone();
        long.extend_from_slice(&[9; 5000]);
        let (body, _) = send_in_parts(&conn, &[&write_page_head(1, PAGE), &long]).await;
        let ResponseBody::Error { code, message } = body else {
            panic!("{body:?}")
        };
        assert_eq!(code, frame::ErrorCode::BadRequest);
        assert!(message.contains("5000 bytes follow"), "{message}");
        assert!(stored(1).is_none(), "a malformed page was stored");
        assert_eq!(counters(&t.node).payloads_apart, 3);

        // Longer than a page: never apart, refused as before.
        let big = vec![1u8; 2 * PAGE as usize];
        let (body, _) = send_in_parts(&conn, &[&write_page_head(2, 2 * PAGE), &big]).await;
        assert!(matches!(body, ResponseBody::Error { .. }), "{body:?}");
        // A small page follows its head.
        let small = page_bytes(400, 3);
        let (body, _) = send_in_parts(&conn, &[&write_page_head(3, 1000), &small[..1000]]).await;
        assert_eq!(body, ResponseBody::Written);
        assert_eq!(counters(&t.node).payloads_apart, 3);
        assert!(stored(3).unwrap() == small[..1000]);

        // A head and part of its page, then nothing.
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(&write_page_head(4, PAGE)).await.unwrap();
        send.write_all(&page_bytes(400, 4)[..1000]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            t.node.partial_bytes() >= PAGE as usize,
            "the page's buffer is not charged"
        );
        assert_eq!(counters(&t.node).payloads_apart, 4);
        assert_reset_within_5s(&mut recv).await;
        assert_eq!(counters(&t.node).stalled, 1);
    });
    assert_eq!(t.node.partial_bytes(), 0);
    assert_eq!(counters(&t.node).rejected, 0);
}

#[test]
fn retry_validates_addresses_when_handshakes_come_fast() {
    let ca = ClusterCa::generate("bounds").unwrap();
    let t = start_node(
        &ca,
        false,
        Limits {
            retry_rate: 0,
            ..Limits::default()
        },
    );
    let addr = t.node.addrs()[0];
    tokio().block_on(async {
        for i in 0..3 {
            let p = pool(&ca, None, "127.0.0.1:0");
            assert_eq!(read_page(&p, addr).await.unwrap(), page_bytes(100, 0));
            let c = counters(&t.node);
            assert_eq!(c.retries, i + 1, "{c:?}");
            assert_eq!(c.connections, i + 1, "{c:?}");
        }
    });
}

#[test]
fn large_writes_from_many_connections_complete_within_a_small_budget() {
    // 8 clients x 4 concurrent writes of a whole page (8 MiB in all) through a node whose budget
    // holds 1.5 requests: requests wait for budget and complete as others finish.
    let ca = ClusterCa::generate("bounds").unwrap();
    let t = start_node(
        &ca,
        false,
        Limits {
            max_partial_bytes: MAX_REQUEST * 3 / 2,
            ..Limits::default()
        },
    );
    let addr = t.node.addrs()[1];
    tokio().block_on(async {
        let mut tasks = Vec::new();
        let writer = ca.issue("writer", tls::Role::Writer).unwrap();
        for c in 0..8u64 {
            let p = pool(&ca, Some(&writer), "127.0.0.1:0");
            for i in 0..4u64 {
                let p = p.clone();
                tasks.push(tokio::spawn(async move {
                    write_page(&p, addr, c * 4 + i).await
                }));
            }
        }
        for task in tasks {
            assert_eq!(task.await.unwrap(), ResponseBody::Written);
        }
    });
    assert_eq!(t.node.partial_bytes(), 0);
    let c = counters(&t.node);
    assert!(c.budget_waits > 0, "no write waited for the budget: {c:?}");
    assert_eq!(c.stalled, 0, "{c:?}");
    for p in 0..32u64 {
        let got = futures_lite::future::block_on(t.node.engine().unwrap().shards()[1].get(
            PageKey::new(300, p),
            0,
            PAGE,
        ))
        .unwrap()
        .unwrap();
        assert!(got == page_bytes(300, p), "page {p}");
    }
}

#[test]
fn a_client_without_a_certificate_is_told_why_it_was_refused() {
    let ca = ClusterCa::generate("bounds").unwrap();
    let t = start_node(&ca, true, Limits::default());
    let addr = t.node.addrs()[0];
    tokio().block_on(async {
        let p = pool(&ca, None, "127.0.0.1:0");
        let e = read_page(&p, addr).await.unwrap_err();
        assert!(
            e.contains("requires a client certificate from the cluster CA")
                && e.contains("certificate_required")
                && e.contains("client-cert.pem")
                && e.contains("--tls-dir"),
            "{e}"
        );
        let intruder = ClusterCa::generate("intruder").unwrap();
        let fake = pool(
            &ca,
            Some(&intruder.issue("x", tls::Role::Admin).unwrap()),
            "127.0.0.1:0",
        );
        let e = read_page(&fake, addr).await.unwrap_err();
        assert!(
            e.contains("requires a client certificate from the cluster CA"),
            "{e}"
        );
        let good = pool(
            &ca,
            Some(&ca.issue("client", tls::Role::Writer).unwrap()),
            "127.0.0.1:0",
        );
        assert_eq!(read_page(&good, addr).await.unwrap(), page_bytes(100, 0));
    });
}

/// A measuring tool, not a test: `PAGESTORE_ATTACK=ADDR,CA_CERT_PEM,CONNECTIONS,STREAMS,BYTES,SECS`
/// opens CONNECTIONS connections to ADDR, starts STREAMS requests of BYTES bytes on each
/// without finishing them, holds them SECS seconds, then leaves. Used for the RSS figures in
/// docs/SECURITY.md, against any pagestored.
#[test]
#[ignore = "a measuring tool; see its comment"]
fn stall_attack() {
    let Ok(spec) = std::env::var("PAGESTORE_ATTACK") else {
        return;
    };
    let v: Vec<&str> = spec.split(',').collect();
    let addr: SocketAddr = v[0].parse().unwrap();
    let ca = tls::load_cert_pem(Path::new(v[1])).unwrap();
    let (conns, streams, bytes, secs): (usize, usize, usize, u64) = (
        v[2].parse().unwrap(),
        v[3].parse().unwrap(),
        v[4].parse().unwrap(),
        v[5].parse().unwrap(),
    );
    tokio().block_on(async {
        let rustls = tls::client_config(&ca, None, frame::ALPN).unwrap();
        let mut cfg = quinn::ClientConfig::new(Arc::new(
            quinn::crypto::rustls::QuicClientConfig::try_from(rustls).unwrap(),
        ));
        cfg.transport_config(transport::transport_config());
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut ep = quinn::Endpoint::new(
            transport::endpoint_config(),
            None,
            socket,
            quinn::default_runtime().unwrap(),
        )
        .unwrap();
        ep.set_default_client_config(cfg);
        let mut held = Vec::new();
        let mut live = Vec::new();
        let mut refused = 0;
        for _ in 0..conns {
            match ep.connect(addr, tls::SERVER_NAME).unwrap().await {
                Ok(c) => {
                    for _ in 0..streams {
                        let (mut s, r) = c.open_bi().await.unwrap();
                        let data = vec![0x5Au8; bytes];
                        // Buffered by quinn; sent as far as the node's flow control allows.
                        let _ = tokio::time::timeout(Duration::from_millis(50), s.write_all(&data))
                            .await;
                        held.push((s, r));
                    }
                    live.push(c);
                }
                Err(_) => refused += 1,
            }
        }
        println!("ATTACK connected {} refused {refused}", live.len());
        tokio::time::sleep(Duration::from_secs(secs)).await;
        ep.close(0u32.into(), b"bye");
    });
}
