//! The error types' messages and source chains (client [`Error`], pool [`ClientError`]).

use std::error::Error as StdError;

use super::*;
use crate::pool::{ConnectFailure, TransferFailure};

/// The message and its causes on one line, each cause once, the way the binaries print them
/// (`pagestore_tools::error_chain`, without its scrubbing).
fn chain(e: &(dyn StdError + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = c.source();
    }
    out
}

fn sources(e: &(dyn StdError + 'static)) -> usize {
    let (mut n, mut cur) = (0, e.source());
    while let Some(c) = cur {
        n += 1;
        cur = c.source();
    }
    n
}

fn quic_config() -> quinn::ClientConfig {
    let ca = pagestore_protocol::tls::ClusterCa::generate("error tests").expect("CA");
    let rustls = pagestore_protocol::tls::client_config(&ca.cert_der(), None, frame::ALPN)
        .expect("rustls client config");
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(rustls).expect("QUIC config");
    quinn::ClientConfig::new(Arc::new(crypto))
}

#[test]
fn answers_read_as_before_and_map_to_the_same_io_kinds() {
    use std::io::ErrorKind as K;
    let cases = [
        (
            Error::NotFound("/data/a".into()),
            "/data/a: no such file or directory",
            K::NotFound,
        ),
        (
            Error::IsDir("/data".into()),
            "/data: is a directory",
            K::IsADirectory,
        ),
        (
            Error::NotDir("/data/a".into()),
            "/data/a: not a directory",
            K::NotADirectory,
        ),
        (
            Error::BadPath("\"a/../b\"".into()),
            "bad path: \"a/../b\"",
            K::InvalidInput,
        ),
        (
            Error::BadRange("offset 9 past 4".into()),
            "bad range: offset 9 past 4",
            K::InvalidInput,
        ),
        (
            Error::Changed("/data/a: changed".into()),
            "/data/a: changed",
            K::StaleNetworkFileHandle,
        ),
        (
            Error::Forbidden("needs writer".into()),
            "refused: needs writer",
            K::PermissionDenied,
        ),
        (
            Error::unavailable("the ring has no members"),
            "unavailable: the ring has no members",
            K::Other,
        ),
        (
            Error::config("the cluster reports a page size of 0"),
            "configuration: the cluster reports a page size of 0",
            K::InvalidInput,
        ),
    ];
    for (e, text, kind) in cases {
        assert_eq!(e.to_string(), text);
        assert!(e.source().is_none(), "{e}: an answer has no source");
        let io = std::io::Error::from(e);
        assert_eq!(io.kind(), kind, "{io}");
        assert_eq!(io.to_string(), text);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_does_not_answer_is_unavailable_with_the_pool_timeout_as_source() {
    // A UDP port that takes packets and never answers: the handshake times out.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let addr = silent.local_addr().expect("local addr");
    let options = ClientOptions {
        call_timeout: Duration::from_millis(200),
        ..ClientOptions::default()
    };
    let r = Client::connect(&ClusterSource::Addr(addr), quic_config(), None, options).await;
    let Err(e) = r else {
        panic!("a silent address connected")
    };
    assert_eq!(
        e.to_string(),
        format!(
            "unavailable: no cluster member answered (no reply from {addr} within 200ms); check \
             --cluster, that pagestored runs, and the TLS settings"
        )
    );
    assert!(matches!(&e, Error::Unavailable { .. }), "{e:?}");
    let cause = e
        .source()
        .and_then(|s| s.downcast_ref::<ClientError>())
        .expect("the pool's error is the source");
    assert!(
        matches!(cause, ClientError::Timeout(a, t) if *a == addr && *t == Duration::from_millis(200)),
        "{cause:?}"
    );
    assert_eq!(cause.addr(), addr);
    // The message holds its cause's text: printed as a chain, nothing is repeated.
    assert_eq!(chain(&e), e.to_string());
    // As an io::Error (pagefs, file handles) the kind and the chain stay.
    let io = std::io::Error::from(e);
    assert_eq!(io.kind(), std::io::ErrorKind::Other);
    let inner = io.get_ref().expect("the client error inside");
    assert!(inner.downcast_ref::<Error>().is_some(), "{inner:?}");
}

#[test]
fn a_store_failure_keeps_the_ufs_error_and_the_store_error_as_sources() {
    let store = object_store::Error::Generic {
        store: "S3",
        source: Box::new(std::io::Error::other(
            "error sending request for url (http://euser:epass@127.0.0.1:9/bucket/k)",
        )),
    };
    let e = Error::from(UfsError::Store("/s3/k".into(), store));
    assert!(matches!(&e, Error::Unavailable { .. }), "{e:?}");
    // The message is the UfsError's, credentials scrubbed, as before.
    assert_eq!(
        e.to_string(),
        "unavailable: /s3/k: Generic S3 error: error sending request for url \
         (http://127.0.0.1:9/bucket/k)"
    );
    let ufs = e
        .source()
        .and_then(|s| s.downcast_ref::<UfsError>())
        .expect("the UfsError is the source");
    assert!(
        matches!(ufs, UfsError::Store(p, _) if p == "/s3/k"),
        "{ufs:?}"
    );
    let store = ufs
        .source()
        .and_then(|s| s.downcast_ref::<object_store::Error>())
        .expect("the object_store error is the UfsError's source");
    assert!(
        matches!(store, object_store::Error::Generic { store: "S3", .. }),
        "{store:?}"
    );
    // UfsError -> object_store::Error -> the HTTP error inside it.
    assert_eq!(sources(&e), 3);
}

#[test]
fn answers_from_the_under_storage_keep_their_kind_and_text() {
    let e = Error::from(UfsError::NotFound("/data/nope".into()));
    assert!(
        matches!(&e, Error::NotFound(p) if p == "/data/nope"),
        "{e:?}"
    );
    let e = Error::from(UfsError::Changed {
        path: "/data/a".into(),
        expected: "v1".into(),
    });
    assert_eq!(
        e.to_string(),
        "/data/a: the object changed (expected version v1); stat it again"
    );
    // A mount setting quoting a URL with credentials: shown without them.
    let e = Error::from(UfsError::Config(
        "/s3: endpoint http://u:pw@host:9 refused".into(),
    ));
    assert!(matches!(&e, Error::Config { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "configuration: /s3: endpoint http://host:9 refused"
    );
}

#[test]
fn errors_nested_as_sources_print_each_text_once() {
    let addr: SocketAddr = "127.0.0.1:7000".parse().expect("addr");
    let node = Error::unavailable_from(
        ClientError::Timeout(addr, Duration::from_secs(3)).to_string(),
        ClientError::Timeout(addr, Duration::from_secs(3)),
    );
    assert_eq!(
        node.to_string(),
        "unavailable: no reply from 127.0.0.1:7000 within 3s"
    );
    let e = Error::unavailable_from(format!("no node answered for job records ({node})"), node);
    // Error -> Error -> ClientError, each text inside the one above it.
    assert_eq!(sources(&e), 2);
    assert_eq!(chain(&e), e.to_string());
}

#[test]
fn a_refused_connection_explains_itself_and_keeps_quinns_report() {
    let addr: SocketAddr = "127.0.0.1:7000".parse().expect("addr");
    let close = quinn::ConnectionError::ConnectionClosed(quinn::ConnectionClose {
        error_code: quinn::TransportErrorCode::crypto(116),
        frame_type: None,
        reason: bytes::Bytes::new(),
    });
    let quinn_text = close.to_string();
    let e = ClientError::Connect(addr, close.into());
    let text = e.to_string();
    assert!(
        text.starts_with("connecting to 127.0.0.1:7000: the node requires a client certificate")
            && text.contains("certificate_required")
            && text.contains("--tls-dir"),
        "{text}"
    );
    let failure = e
        .source()
        .and_then(|s| s.downcast_ref::<ConnectFailure>())
        .expect("typed source");
    assert!(matches!(failure, ConnectFailure::Refused(_)), "{failure:?}");
    assert!(failure
        .source()
        .is_some_and(|s| s.downcast_ref::<quinn::ConnectionError>().is_some()));
    // The explanation replaces quinn's text: a chain shows that once, after it.
    assert_eq!(chain(&e), format!("{text}: {quinn_text}"));

    // A handshake that just fails quotes quinn.
    let e = ClientError::Connect(addr, quinn::ConnectionError::TimedOut.into());
    assert_eq!(e.to_string(), "connecting to 127.0.0.1:7000: timed out");
    assert!(matches!(
        e.source().and_then(|s| s.downcast_ref::<ConnectFailure>()),
        Some(ConnectFailure::Handshake(quinn::ConnectionError::TimedOut))
    ));
}

#[test]
fn a_failed_transfer_keeps_the_stream_error() {
    let addr: SocketAddr = "127.0.0.1:7000".parse().expect("addr");
    let lost = quinn::WriteError::ConnectionLost(quinn::ConnectionError::Reset);
    let e = ClientError::Transfer(addr, lost.into());
    assert_eq!(
        e.to_string(),
        "request to 127.0.0.1:7000 failed: connection lost"
    );
    assert!(matches!(
        e.source().and_then(|s| s.downcast_ref::<TransferFailure>()),
        Some(TransferFailure::Write(quinn::WriteError::ConnectionLost(_)))
    ));
    // quinn's "connection lost" has the reason as its own source: the chain names it.
    assert_eq!(
        chain(&e),
        format!(
            "request to 127.0.0.1:7000 failed: connection lost: {}",
            quinn::ConnectionError::Reset
        )
    );
    let e = ClientError::Protocol(addr, crate::pool::ProtocolFailure::TrailingBytes);
    assert_eq!(
        e.to_string(),
        "bad reply from 127.0.0.1:7000: bytes after the reply frame"
    );
}
