//! Test support for pagestore (dev-only, never published): real servers started in-process, a
//! cluster of real `pagestored` processes with an etcd helper ([`local_cluster`]), a faulty disk
//! for the engine ([`faulty`]), the deterministic data generator ([`data`]), the cluster
//! fixture the binaries' integration tests share ([`fixture`]), the Python environment the
//! Python-driven tests share ([`python`]), an Azure Blob Storage server ([`azurite`]) and a TCP
//! relay that can hold a request part way ([`gate`]).
//!
//! [`S3Server`] serves a local directory over the S3 protocol (the `s3s` server framework with
//! its `s3s-fs` file-system backend), with SigV4 authentication, on a loopback port of its own.
//! It runs on a thread with its own tokio runtime, so it works the same from plain `#[test]`
//! functions and from `#[tokio::test]` ones.
//!
//! Layout: every subdirectory of the root is a bucket; files below it are objects whose keys are
//! their relative paths. Files written straight into the directory are served as they are (the
//! backend computes their MD5 etag when asked), so a test can rewrite an object on disk to
//! simulate a change at the origin.

pub mod azurite;
pub mod data;
pub mod faulty;
pub mod fixture;
pub mod gate;
pub mod local_cluster;
pub mod openmetrics;
pub mod python;

use std::{
    fmt::Write as _,
    io,
    net::{Ipv4Addr, SocketAddr, TcpListener as StdTcpListener},
    path::Path,
    sync::mpsc,
    thread::JoinHandle,
    time::Duration,
};

use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto::Builder as ConnBuilder,
};
use s3s::{auth::SimpleAuth, service::S3Service, service::S3ServiceBuilder};
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

/// An S3-protocol server over a local directory, bound to `127.0.0.1` on an ephemeral port.
///
/// Dropping it stops the server (open connections are closed) and joins its thread.
#[derive(Debug)]
pub struct S3Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// How long a stopping server waits for file reads already under way.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

impl S3Server {
    /// Serves `root` (which must exist) as S3; buckets are its subdirectories. Requests must be
    /// signed (SigV4) with `access_key` and `secret_key`; the region is not checked.
    pub fn start(root: &Path, access_key: &str, secret_key: &str) -> io::Result<S3Server> {
        S3Server::start_at(root, access_key, secret_key, 0)
    }

    /// [`S3Server::start`] on port `port` of `127.0.0.1` (0: any free one): a server stopped
    /// and started again on its old port, for tests of a store that goes away and comes back.
    pub fn start_at(
        root: &Path,
        access_key: &str,
        secret_key: &str,
        port: u16,
    ) -> io::Result<S3Server> {
        S3Server::serve(root, Some((access_key, secret_key)), port)
    }

    /// [`S3Server::start`] taking requests unsigned (no credentials checked): the stand-in for
    /// Google Cloud Storage's XML API, which `object_store` speaks to `gs://` buckets and which
    /// answers as S3 does, for a client without credentials (`anonymous=true`).
    pub fn start_unsigned(root: &Path) -> io::Result<S3Server> {
        S3Server::serve(root, None, 0)
    }

    fn serve(root: &Path, auth: Option<(&str, &str)>, port: u16) -> io::Result<S3Server> {
        let fs = s3s_fs::FileSystem::new(root).map_err(|e| {
            io::Error::other(format!(
                "s3 test server: cannot serve {}: {e:?}",
                root.display()
            ))
        })?;
        let service = {
            let mut b = S3ServiceBuilder::new(fs);
            if let Some((access_key, secret_key)) = auth {
                b.set_auth(SimpleAuth::from_single(access_key, secret_key));
            }
            b.build()
        };
        // Bind here, before the thread exists, so that a failure reaches the caller and the
        // port accepts connections (into its backlog) as soon as `start` returns.
        let listener = StdTcpListener::bind((Ipv4Addr::LOCALHOST, port))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop_tx, stop_rx) = oneshot::channel();
        let (ready_tx, ready_rx) = mpsc::channel::<io::Result<()>>();
        let thread = std::thread::Builder::new()
            .name(format!("s3-test-server-{}", addr.port()))
            .spawn(move || {
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    serve(listener, service, stop_rx).await;
                });
                // Connections still open are dropped with the runtime's tasks.
                rt.shutdown_timeout(SHUTDOWN_GRACE);
            })?;
        let server = S3Server {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        };
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(server),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::other(
                "s3 test server: the server thread ended before it was ready",
            )),
        }
    }

    /// The base URL, `http://127.0.0.1:PORT` (no trailing slash); use path-style requests.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            // A panic on the server thread has already been reported there.
            let _ = thread.join();
        }
    }
}

async fn serve(listener: tokio::net::TcpListener, service: S3Service, stop: oneshot::Receiver<()>) {
    let http = ConnBuilder::new(TokioExecutor::new());
    tokio::pin!(stop);
    loop {
        tokio::select! {
            // A send or a dropped sender both mean stop.
            _ = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok((socket, _peer)) => {
                    let _ = socket.set_nodelay(true);
                    let conn = http
                        .serve_connection(TokioIo::new(socket), service.clone())
                        .into_owned();
                    tokio::spawn(async move {
                        // A client that goes away mid-request is not the server's failure.
                        let _ = conn.await;
                    });
                }
                // Out of file descriptors and the like: back off instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
        }
    }
}

/// The SHA-256 of `bytes` as 64 lowercase hex digits.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(digest.len() * 2);
    for b in digest.iter() {
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn sha256_of_known_inputs() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn starts_on_loopback_and_stops_on_drop() {
        let d = tempfile::tempdir().unwrap();
        let s = S3Server::start(d.path(), "k", "s").unwrap();
        assert!(s.addr().ip().is_loopback());
        assert_ne!(s.addr().port(), 0);
        assert_eq!(
            s.endpoint(),
            format!("http://127.0.0.1:{}", s.addr().port())
        );
        // An unsigned request is refused, but answered.
        let mut c = std::net::TcpStream::connect(s.addr()).unwrap();
        use std::io::{Read, Write};
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut reply = String::new();
        c.read_to_string(&mut reply).unwrap();
        assert!(reply.starts_with("HTTP/1.1 "), "{reply}");
        assert!(!reply.starts_with("HTTP/1.1 200"), "{reply}");
        let addr = s.addr();
        drop(s);
        assert!(std::net::TcpStream::connect(addr).is_err());
    }

    #[test]
    fn a_missing_root_is_an_error() {
        assert!(S3Server::start(Path::new("/definitely/not/here"), "k", "s").is_err());
    }
}
