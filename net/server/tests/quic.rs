//! A node's per-shard QUIC endpoints on loopback (quinn-proto on glommio) against the quinn
//! (tokio) client pool, speaking the real wire protocol: pages byte-exact over many concurrent
//! streams, each request served by the shard whose port it reached, writes, not-owner answers,
//! malformed and oversized requests, mutual TLS, and connections closed mid-transfer.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::{net::SocketAddr, sync::Arc, time::Duration};

use common::no_ring;
use pagestore_client::pool::{ClientError, Pool, PoolOptions};
use pagestore_engine::PageKey;
use pagestore_protocol::{
    frame::{self, ErrorCode, FileId, Key, PageStatus, Request, RequestBody, ResponseBody},
    ring::{MemberId, Ring, RingConfig},
    tls::{self, ClusterCa, Identity},
    transport,
};
use pagestore_server::node::Node;

const PAGE: u32 = 256 * 1024;
const NODE: u128 = 0xA11CE;

/// The bytes of a whole page of `file` (version 1).
fn page_bytes(file: u128, page: u64) -> Vec<u8> {
    common::page_bytes(file, page, PAGE)
}

struct TestNode {
    node: Node,
    ca: ClusterCa,
    _dir: tempfile::TempDir,
}

fn start_node(require_client_cert: bool, ring: Ring) -> TestNode {
    let dir = common::tempdir();
    let ca = ClusterCa::generate("test cluster").unwrap();
    let server = common::server_config(&ca, require_client_cert);
    // max_buffered is small (one request), so that concurrent writes must pause and resume (see
    // the last test).
    let node = Node::start(
        common::engine_config(dir.path(), PAGE, 128, 2),
        common::node_options(server, NODE, ring),
    )
    .unwrap();
    // Two pages on each shard, put through the engine directly.
    futures_lite::future::block_on(async {
        let e = node.engine().unwrap();
        for s in 0..2u64 {
            for p in 0..2u64 {
                let file = 100 + s as u128;
                e.shards()[s as usize]
                    .put(PageKey::new(file, p), page_bytes(file, p), 1)
                    .await
                    .unwrap();
            }
        }
    });
    TestNode {
        node,
        ca,
        _dir: dir,
    }
}

fn pool(ca: &ClusterCa, identity: Option<&Identity>) -> Arc<Pool> {
    common::pool(ca, identity, "127.0.0.1:0")
}

fn key(file: u128, page: u64) -> Key {
    Key {
        file_id: FileId::from_u128(file),
        page,
    }
}

async fn read(
    pool: &Pool,
    addr: SocketAddr,
    file: u128,
    page: u64,
    offset: u32,
    len: u32,
) -> Result<(ResponseBody, Vec<u8>), ClientError> {
    let req = Request {
        request_id: page + 1,
        body: RequestBody::ReadRange {
            key: key(file, page),
            offset,
            len,
            epoch: 0,
        },
    };
    pool.request(addr, &req, bytes::Bytes::new())
        .await
        .map(|(r, body)| (r.body, body.to_vec()))
}

fn tokio() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn pages_byte_exact_over_many_streams_each_served_by_its_shard() {
    let t = start_node(false, no_ring());
    let addrs = t.node.addrs().to_vec();
    tokio().block_on(async {
        let pool = pool(&t.ca, None);
        for (shard, addr) in addrs.iter().enumerate() {
            // The endpoint on this port is this shard.
            let stat = Request {
                request_id: 9,
                body: RequestBody::Stat,
            };
            match pool
                .request(*addr, &stat, bytes::Bytes::new())
                .await
                .unwrap()
                .0
                .body
            {
                ResponseBody::Stat {
                    shard: s, pages, ..
                } => assert_eq!((s as usize, pages), (shard, 2)),
                other => panic!("{other:?}"),
            }
            let mut tasks = Vec::new();
            for i in 0..64u64 {
                let pool = pool.clone();
                let addr = *addr;
                let file = 100 + shard as u128;
                tasks.push(tokio::spawn(async move {
                    let page = i % 3; // page 2 is not cached
                    let (off, len) = if i % 2 == 0 {
                        (0, frame::MAX_PAGE_LEN)
                    } else {
                        (1000 + i as u32, 5000)
                    };
                    (
                        page,
                        off,
                        len,
                        read(&pool, addr, file, page, off, len).await,
                    )
                }));
            }
            for task in tasks {
                let (page, off, len, r) = task.await.unwrap();
                let (body, bytes) = r.unwrap();
                if page == 2 {
                    assert_eq!(body, ResponseBody::Miss);
                    continue;
                }
                assert_eq!(
                    body,
                    ResponseBody::Data {
                        page_len: PAGE,
                        version: 1,
                        spread: 0,
                    }
                );
                let want = page_bytes(100 + shard as u128, page);
                let end = (off as usize).saturating_add(len as usize).min(want.len());
                assert!(
                    bytes == want[off as usize..end],
                    "shard {shard} page {page} range {off}+{len}"
                );
            }
        }
        pool.close();
    });
    let served = futures_lite::future::block_on(t.node.requests_served()).unwrap();
    assert_eq!(
        served,
        vec![65, 65],
        "each shard served exactly the requests sent to its port"
    );
}

#[test]
fn writes_then_reads_and_remove_file() {
    let t = start_node(false, no_ring());
    let addr = t.node.addrs()[0];
    tokio().block_on(async {
        // Writing and removing need the writer and admin roles.
        let pool = pool(&t.ca, Some(&t.ca.issue("admin", tls::Role::Admin).unwrap()));
        let data = page_bytes(7, 7)[..100_000].to_vec();
        let w = Request {
            request_id: 1,
            body: RequestBody::WritePage {
                key: key(7, 7),
                version: 3,
                len: data.len() as u32,
                epoch: 0,
            },
        };
        assert_eq!(
            pool.request(addr, &w, bytes::Bytes::copy_from_slice(&data))
                .await
                .unwrap()
                .0
                .body,
            ResponseBody::Written
        );
        let (body, bytes) = read(&pool, addr, 7, 7, 0, frame::MAX_PAGE_LEN)
            .await
            .unwrap();
        assert_eq!(
            body,
            ResponseBody::Data {
                page_len: 100_000,
                version: 3,
                spread: 0,
            }
        );
        assert!(bytes == data);
        // Several pages at once, with a miss among them.
        let many = Request {
            request_id: 2,
            body: RequestBody::ReadPages {
                pages: vec![key(7, 7), key(7, 8), key(7, 7)],
                epoch: 0,
            },
        };
        let (resp, bytes) = pool
            .request(addr, &many, bytes::Bytes::new())
            .await
            .unwrap();
        let l = data.len() as u32;
        assert_eq!(
            resp.body,
            ResponseBody::Pages {
                entries: vec![
                    PageStatus::Data { len: l },
                    PageStatus::Miss,
                    PageStatus::Data { len: l }
                ]
            }
        );
        assert!(bytes[..data.len()] == data[..] && bytes[data.len()..] == data[..]);
        // A range past the end of the page is a typed error.
        let (body, _) = read(&pool, addr, 7, 7, 200_000, 10).await.unwrap();
        assert!(
            matches!(
                body,
                ResponseBody::Error {
                    code: ErrorCode::BadRange,
                    ..
                }
            ),
            "{body:?}"
        );
        let rm = Request {
            request_id: 3,
            body: RequestBody::RemoveFile {
                file_id: FileId::from_u128(7),
                epoch: 0,
            },
        };
        assert_eq!(
            pool.request(addr, &rm, bytes::Bytes::new())
                .await
                .unwrap()
                .0
                .body,
            ResponseBody::Removed { pages: 1 }
        );
        assert_eq!(
            read(&pool, addr, 7, 7, 0, 10).await.unwrap().0,
            ResponseBody::Miss
        );
    });
}

#[test]
fn keys_owned_by_another_member_are_answered_not_owner() {
    // Ring of this node (2 shards) and another node (4 shards), epoch 12.
    let members = [(NODE, 2u16), (0xB0B, 4)]
        .into_iter()
        .flat_map(|(node, n)| (0..n).map(move |shard| MemberId { node, shard }));
    let ring = Ring::new(members, RingConfig::default(), 12).unwrap();
    let t = start_node(false, ring.clone());
    tokio().block_on(async {
        let pool = pool(&t.ca, None);
        let mut checked = (0, 0);
        for page in 0..40u64 {
            let owner = ring.owner(555, page).unwrap();
            for (shard, addr) in t.node.addrs().iter().enumerate() {
                let (body, _) = read(&pool, *addr, 555, page, 0, 10).await.unwrap();
                if owner
                    == (MemberId {
                        node: NODE,
                        shard: shard as u16,
                    })
                {
                    assert_eq!(body, ResponseBody::Miss, "owner answers from its cache");
                    checked.0 += 1;
                } else {
                    assert_eq!(body, ResponseBody::NotOwner { epoch: 12 });
                    checked.1 += 1;
                }
            }
        }
        assert!(checked.0 > 0 && checked.1 > 0, "{checked:?}");
        let e = Request {
            request_id: 1,
            body: RequestBody::RingEpoch,
        };
        assert_eq!(
            pool.request(t.node.addrs()[1], &e, bytes::Bytes::new())
                .await
                .unwrap()
                .0
                .body,
            ResponseBody::Epoch { epoch: 12 }
        );
    });
}

#[test]
fn malformed_and_oversized_requests_get_errors_and_the_connection_survives() {
    let t = start_node(false, no_ring());
    let addr = t.node.addrs()[1];
    tokio().block_on(async {
        let pool = pool(&t.ca, None);
        let ping = Request {
            request_id: 5,
            body: RequestBody::Ping { nonce: 99 },
        };
        for garbage in [
            &b""[..],
            b"hello",
            &[0u8; 16],
            &[0xFFu8; 200],
            b"PSTF\x03\x00\x01\x00\x10\x00\x00\x00\x00\x00\x00\x00garbagegarbage!!",
        ] {
            let raw = pool.call(addr, garbage, bytes::Bytes::new()).await.unwrap();
            let (resp, _) = frame::decode_response_frame(&raw).unwrap();
            assert!(
                matches!(
                    resp.body,
                    ResponseBody::Error {
                        code: ErrorCode::BadRequest | ErrorCode::TooLarge,
                        ..
                    }
                ),
                "{garbage:?}: {resp:?}"
            );
            // The same connection still serves.
            assert_eq!(
                pool.request(addr, &ping, bytes::Bytes::new())
                    .await
                    .unwrap()
                    .0
                    .body,
                ResponseBody::Pong { nonce: 99 }
            );
        }
        // Larger than the endpoint accepts: the stream is reset, the connection lives on.
        let huge = vec![0u8; 2 << 20];
        let r = pool.call(addr, &huge, bytes::Bytes::new()).await;
        assert!(matches!(r, Err(ClientError::Transfer(..))), "{r:?}");
        assert_eq!(
            pool.request(addr, &ping, bytes::Bytes::new())
                .await
                .unwrap()
                .0
                .body,
            ResponseBody::Pong { nonce: 99 }
        );
    });
}

#[test]
fn mutual_tls_refuses_clients_without_a_cluster_certificate() {
    let t = start_node(true, no_ring());
    let addr = t.node.addrs()[0];
    tokio().block_on(async {
        let no_cert = pool(&t.ca, None);
        assert!(
            read(&no_cert, addr, 100, 0, 0, 10).await.is_err(),
            "no certificate, yet served"
        );
        let intruder = ClusterCa::generate("intruder").unwrap();
        let fake = pool(&t.ca, Some(&intruder.issue("x", tls::Role::Admin).unwrap()));
        assert!(
            read(&fake, addr, 100, 0, 0, 10).await.is_err(),
            "foreign certificate, yet served"
        );
        let good = pool(
            &t.ca,
            Some(&t.ca.issue("client", tls::Role::Reader).unwrap()),
        );
        let (body, bytes) = read(&good, addr, 100, 0, 0, frame::MAX_PAGE_LEN)
            .await
            .unwrap();
        assert_eq!(
            body,
            ResponseBody::Data {
                page_len: PAGE,
                version: 1,
                spread: 0,
            }
        );
        assert!(bytes == page_bytes(100, 0));
    });
}

#[test]
fn a_node_shutting_down_mid_transfer_gives_errors_not_hangs() {
    let t = start_node(false, no_ring());
    let addr = t.node.addrs()[1];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // A reply far larger than the stream window (200 copies of a 256 KiB page = 50 MiB), read
    // only a little: the server is blocked mid-transfer when it shuts down.
    let (pool, mut recv) = rt.block_on(async {
        let pool = pool(&t.ca, None);
        let conn = pool.connection(addr).await.unwrap();
        let req = Request {
            request_id: 1,
            body: RequestBody::ReadPages {
                pages: vec![key(101, 0); 200],
                epoch: 0,
            },
        };
        let mut head = Vec::new();
        frame::encode_request(&req, 0, &mut head).unwrap();
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(&head).await.unwrap();
        send.finish().unwrap();
        let mut first = vec![0u8; 64 << 10];
        recv.read_exact(&mut first).await.unwrap();
        (pool, recv)
    });
    t.node.shutdown().unwrap();
    rt.block_on(async {
        let rest = tokio::time::timeout(Duration::from_secs(5), recv.read_to_end(64 << 20))
            .await
            .expect("the client hung after the node closed mid-transfer");
        assert!(
            rest.is_err(),
            "a 50 MiB reply completed although the node shut down"
        );
        // Nothing answers any more (a dead address fails at the handshake or times out).
        let after =
            tokio::time::timeout(Duration::from_secs(2), read(&pool, addr, 101, 0, 0, 10)).await;
        assert!(!matches!(after, Ok(Ok(_))), "a closed node still answered");
    });
    rt.shutdown_timeout(Duration::from_secs(1));
}

#[test]
fn many_concurrent_large_writes_complete_within_the_connection_buffer_budget() {
    // 64 writes of ~250 KB at once (16 MB): far more than the 1 MiB a connection of this node may
    // hold in request buffers, so the endpoint must pause reading streams and resume them as
    // others complete.
    let t = start_node(false, no_ring());
    let addr = t.node.addrs()[0];
    tokio().block_on(async {
        let pool = pool(
            &t.ca,
            Some(&t.ca.issue("writer", tls::Role::Writer).unwrap()),
        );
        let mut tasks = Vec::new();
        for i in 0..64u64 {
            let pool = pool.clone();
            tasks.push(tokio::spawn(async move {
                let data = page_bytes(900, i)[..250_000].to_vec();
                let w = Request {
                    request_id: i,
                    body: RequestBody::WritePage {
                        key: key(900, i),
                        version: 1,
                        len: data.len() as u32,
                        epoch: 0,
                    },
                };
                pool.request(addr, &w, bytes::Bytes::copy_from_slice(&data))
                    .await
                    .map(|r| r.0.body)
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap().unwrap(), ResponseBody::Written);
        }
        for i in 0..64u64 {
            let (body, bytes) = read(&pool, addr, 900, i, 0, frame::MAX_PAGE_LEN)
                .await
                .unwrap();
            assert!(matches!(body, ResponseBody::Data { .. }));
            assert!(bytes == page_bytes(900, i)[..250_000], "page {i}");
        }
    });
}

#[test]
fn garbage_datagrams_do_not_disturb_a_shard() {
    let t = start_node(false, no_ring());
    let addr = t.node.addrs()[0];
    // Random bytes, truncated QUIC-looking headers, empty and oversized datagrams.
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut rng = pagestore_testkit::data::Xorshift::new(0x1234_5678_9abc_def0);
    for i in 0..2000usize {
        let len = [0, 1, 5, 20, 1200, 1500, 9000, 60_000][i % 8];
        let mut d = vec![0u8; len];
        rng.fill(&mut d);
        if i % 3 == 0 && !d.is_empty() {
            d[0] = 0xC0 | (d[0] & 0x0F); // long header form, random version and CIDs
        }
        let _ = sock.send_to(&d, addr);
    }
    tokio().block_on(async {
        let pool = pool(&t.ca, None);
        let (body, bytes) = read(&pool, addr, 100, 1, 0, frame::MAX_PAGE_LEN)
            .await
            .unwrap();
        assert_eq!(
            body,
            ResponseBody::Data {
                page_len: PAGE,
                version: 1,
                spread: 0,
            }
        );
        assert!(bytes == page_bytes(100, 1));
    });
}

/// A TLS client that trusts any server and carries no pagestore material at all: what an
/// attacker who only knows a node's address can build.
#[derive(Debug)]
struct TrustAnything(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for TrustAnything {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn stranger_pool() -> Arc<Pool> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut rustls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(TrustAnything(provider)))
        .with_no_client_auth();
    rustls.alpn_protocols = vec![frame::ALPN.to_vec()];
    let mut cfg = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(rustls).unwrap(),
    ));
    cfg.transport_config(transport::transport_config());
    Pool::new(cfg, "127.0.0.1:0".parse().unwrap(), PoolOptions::default()).unwrap()
}

fn forbidden(body: &ResponseBody) -> bool {
    matches!(
        body,
        ResponseBody::Error {
            code: ErrorCode::Forbidden,
            ..
        }
    )
}

#[test]
fn only_writers_change_what_other_clients_read() {
    let t = start_node(false, no_ring());
    let addr = t.node.addrs()[0];
    tokio().block_on(async {
        let honest = pool(&t.ca, None);
        let original = page_bytes(100, 0);
        let poison = vec![0x66u8; PAGE as usize];
        let write = |version| Request {
            request_id: 9,
            body: RequestBody::WritePage {
                key: key(100, 0),
                version,
                len: PAGE,
                epoch: 0,
            },
        };
        let remove = Request {
            request_id: 10,
            body: RequestBody::RemoveFile {
                file_id: FileId::from_u128(100),
                epoch: 0,
            },
        };
        let invalidate = Request {
            request_id: 11,
            body: RequestBody::Invalidate {
                path: "/data/x".into(),
                file_id: FileId::from_u128(100),
            },
        };
        let job = Request {
            request_id: 12,
            body: RequestBody::Jobs,
        };
        let forged_job = frame::encode_job_record(&frame::JobRecord {
            id: "forged".into(),
            ..frame::JobRecord::default()
        })
        .unwrap();
        let attackers = [
            ("a client without any cluster material", stranger_pool()),
            ("a client without a certificate", pool(&t.ca, None)),
            (
                "a client with a reader certificate",
                pool(&t.ca, Some(&t.ca.issue("r", tls::Role::Reader).unwrap())),
            ),
        ];
        for (who, p) in &attackers {
            for (what, req, payload) in [
                ("WritePage", write(1), &poison[..]),
                ("WritePage", write(2), &poison[..]),
                ("RemoveFile", remove.clone(), &[][..]),
                ("Invalidate", invalidate.clone(), &[][..]),
                ("Jobs with a record", job.clone(), &forged_job[..]),
            ] {
                let (resp, _) = p
                    .request(addr, &req, bytes::Bytes::copy_from_slice(payload))
                    .await
                    .unwrap();
                assert!(
                    forbidden(&resp.body),
                    "{who}: {what} answered {:?}",
                    resp.body
                );
            }
            // Reading stays open to them.
            let (body, _) = read(p, addr, 100, 0, 0, 16).await.unwrap();
            assert!(matches!(body, ResponseBody::Data { .. }), "{who}: {body:?}");
            // And the honest reader still gets the original bytes.
            let (_, bytes) = read(&honest, addr, 100, 0, 0, PAGE).await.unwrap();
            assert!(bytes == original, "{who} changed what others read");
        }
        // The refusal says what is needed and what the connection has.
        let (resp, _) = attackers[2]
            .1
            .request(addr, &write(1), bytes::Bytes::copy_from_slice(&poison))
            .await
            .unwrap();
        let ResponseBody::Error { message, .. } = resp.body else {
            unreachable!()
        };
        assert!(
            message.contains("writer role") && message.contains("reader"),
            "{message}"
        );
        // A writer may write but not remove a whole file; an admin may.
        let writer = pool(&t.ca, Some(&t.ca.issue("w", tls::Role::Writer).unwrap()));
        let (resp, _) = writer
            .request(addr, &write(5), bytes::Bytes::copy_from_slice(&poison))
            .await
            .unwrap();
        assert_eq!(resp.body, ResponseBody::Written);
        let (resp, _) = writer
            .request(addr, &remove, bytes::Bytes::new())
            .await
            .unwrap();
        assert!(forbidden(&resp.body), "{:?}", resp.body);
        let admin = pool(&t.ca, Some(&t.ca.issue("a", tls::Role::Admin).unwrap()));
        let (resp, _) = admin
            .request(addr, &remove, bytes::Bytes::new())
            .await
            .unwrap();
        assert!(
            matches!(resp.body, ResponseBody::Removed { .. }),
            "{:?}",
            resp.body
        );
        // A certificate from another CA is refused at the handshake, role or not.
        let intruder = ClusterCa::generate(tls::CA_NAME).unwrap();
        let fake = pool(&t.ca, Some(&intruder.issue("x", tls::Role::Admin).unwrap()));
        assert!(fake
            .request(addr, &write(1), bytes::Bytes::copy_from_slice(&poison))
            .await
            .is_err());
        // Every refusal was counted: 3 attackers x 5 requests, the message probe, the writer's
        // removal.
        let counters = Request {
            request_id: 13,
            body: RequestBody::Counters,
        };
        let (resp, payload) = honest
            .request(addr, &counters, bytes::Bytes::new())
            .await
            .unwrap();
        assert_eq!(resp.body, ResponseBody::Counters);
        let c = frame::decode_counters(&payload).unwrap();
        assert_eq!(c.forbidden, 17, "{c:?}");
    });
}

/// What nodes tell each other (the write-back records, what to do with a version's pages)
/// needs a node certificate: a writer or an anonymous client asking for a path's records, or
/// handing records on, is refused. A node's own certificate is let through (this node keeps no
/// write-back records, which it says).
#[test]
fn what_nodes_tell_each_other_needs_the_node_role() {
    let t = start_node(false, no_ring());
    let addr = t.node.addrs()[0];
    tokio().block_on(async {
        let bodies = [
            RequestBody::Replicate,
            RequestBody::PullRecords { after: "".into() },
            RequestBody::RecordsOf {
                paths: vec!["/ck/lock".into()],
            },
            RequestBody::RecordsIn {
                dir: "/ck".into(),
                after: "".into(),
                digest: 0,
            },
            RequestBody::FilePages {
                file_id: FileId::from_u128(100),
                action: frame::PageAction::Drop,
            },
        ];
        let writer = pool(&t.ca, Some(&t.ca.issue("w", tls::Role::Writer).unwrap()));
        let anonymous = pool(&t.ca, None);
        let node = pool(&t.ca, Some(&t.ca.issue("n2", tls::Role::Node).unwrap()));
        for body in bodies {
            let req = Request {
                request_id: 1,
                body: body.clone(),
            };
            for who in [&writer, &anonymous] {
                let (resp, _) = who.request(addr, &req, bytes::Bytes::new()).await.unwrap();
                assert!(forbidden(&resp.body), "{body:?}: {:?}", resp.body);
            }
            let (resp, _) = node.request(addr, &req, bytes::Bytes::new()).await.unwrap();
            assert!(!forbidden(&resp.body), "{body:?}: {:?}", resp.body);
        }
    });
}

#[test]
fn counters_and_job_records_travel_typed_and_malformed_records_are_refused() {
    let t = start_node(false, no_ring());
    let addr = t.node.addrs()[1];
    tokio().block_on(async {
        let writer = pool(&t.ca, Some(&t.ca.issue("w", tls::Role::Writer).unwrap()));
        let jobs = Request {
            request_id: 1,
            body: RequestBody::Jobs,
        };
        // Nothing kept yet.
        let (resp, payload) = writer
            .request(addr, &jobs, bytes::Bytes::new())
            .await
            .unwrap();
        assert_eq!(resp.body, ResponseBody::Jobs);
        assert!(frame::decode_job_records(&payload).unwrap().is_empty());
        // A record is kept and comes back as it was sent.
        let record = frame::JobRecord {
            id: "load-1".into(),
            source: "prefix /data".into(),
            state: frame::JobState::Done,
            first_page_secs: Some(0.25),
            files_total: 4,
            files_done: 4,
            bytes_loaded: 1 << 20,
            ..frame::JobRecord::default()
        };
        let payload = frame::encode_job_record(&record).unwrap();
        let (resp, payload) = writer
            .request(addr, &jobs, bytes::Bytes::copy_from_slice(&payload))
            .await
            .unwrap();
        assert_eq!(resp.body, ResponseBody::Jobs);
        assert_eq!(
            frame::decode_job_records(&payload).unwrap(),
            std::slice::from_ref(&record)
        );
        // Malformed records: a bad request each, and the board is unchanged.
        let mut cut = frame::encode_job_record(&record).unwrap();
        cut.truncate(cut.len() - 1);
        let mut flipped = frame::encode_job_record(&record).unwrap();
        let state_at = flipped.len() - std::mem::size_of::<frame::ArchivedJobRecord>() + 24;
        flipped[state_at] = 9; // no such JobState
        for bad in [br#"{"id":"json"}"#.to_vec(), vec![0xff; 200], cut, flipped] {
            let (resp, _) = writer
                .request(addr, &jobs, bytes::Bytes::copy_from_slice(&bad))
                .await
                .unwrap();
            match resp.body {
                ResponseBody::Error {
                    code: ErrorCode::BadRequest,
                    message,
                } => assert!(message.starts_with("job record: "), "{message}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        let (_, payload) = writer
            .request(addr, &jobs, bytes::Bytes::new())
            .await
            .unwrap();
        assert_eq!(frame::decode_job_records(&payload).unwrap(), [record]);
        // The counters name the shard that answered.
        let counters = Request {
            request_id: 2,
            body: RequestBody::Counters,
        };
        let (resp, payload) = writer
            .request(addr, &counters, bytes::Bytes::new())
            .await
            .unwrap();
        assert_eq!(resp.body, ResponseBody::Counters);
        let c = frame::decode_counters(&payload).unwrap();
        assert_eq!(c.shard, 1);
        assert_eq!(c.pages, 2);
        assert!(c.capacity_bytes > 0);
    });
}
