//! Bounded HTTP/1.1 serving for the endpoints an outside client can reach (`pages3` and the
//! admin endpoint of `pagestored`): a deadline for the request head, a stall deadline for
//! request bodies, a limit on open connections (in total and per source address), and a
//! back-off when `accept` fails (out of file descriptors: without it the loop spins).

use std::{
    collections::HashMap,
    future::Future,
    io,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt as _;

/// Limits of one HTTP endpoint.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Time allowed for a request head (request line and headers) to arrive.
    pub header_timeout: Duration,
    /// Time a request body may make no progress while the server waits for it.
    pub body_stall_timeout: Duration,
    /// Connections open at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// Connections open at once from one source address (0: no per-address limit).
    pub max_connections_per_ip: usize,
}

impl Limits {
    /// `pages3`'s defaults.
    pub const PAGES3: Limits = Limits {
        header_timeout: Duration::from_secs(10),
        body_stall_timeout: Duration::from_secs(30),
        max_connections: 1024,
        max_connections_per_ip: 128,
    };

    /// The admin endpoint's defaults (scrapes and operators only).
    pub const ADMIN: Limits = Limits {
        header_timeout: Duration::from_secs(10),
        body_stall_timeout: Duration::from_secs(10),
        max_connections: 64,
        max_connections_per_ip: 0,
    };
}

/// Back-off for a failing `accept`.
///
/// A connection that failed on its own (aborted, reset) is retried at once. Anything else
/// (EMFILE, ENFILE, ENOBUFS, ENOMEM, ...) repeats until something changes, so the loop waits:
/// 10 ms, doubling up to 1 s, reset by the next successful accept.
#[derive(Debug)]
pub struct AcceptBackoff {
    next: Duration,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        AcceptBackoff::new()
    }
}

impl AcceptBackoff {
    /// First delay.
    pub const MIN: Duration = Duration::from_millis(10);
    /// Longest delay.
    pub const MAX: Duration = Duration::from_secs(1);

    /// A fresh back-off.
    pub fn new() -> AcceptBackoff {
        AcceptBackoff { next: Self::MIN }
    }

    /// How long to wait after `e` before accepting again.
    pub fn failed(&mut self, e: &io::Error) -> Duration {
        if matches!(
            e.kind(),
            io::ErrorKind::ConnectionAborted
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::Interrupted
        ) {
            return Duration::ZERO;
        }
        let d = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        d
    }

    /// A connection was accepted: the next failure starts from the shortest delay again.
    pub fn succeeded(&mut self) {
        self.next = Self::MIN;
    }
}

/// Counts open connections, in total and per source address.
#[derive(Debug)]
pub struct ConnGate {
    limits: Limits,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// One admitted connection; dropping it frees its place.
#[derive(Debug)]
pub struct ConnPermit {
    gate: Arc<ConnGate>,
    ip: IpAddr,
}

impl ConnGate {
    /// A gate with these limits.
    pub fn new(limits: Limits) -> Arc<ConnGate> {
        Arc::new(ConnGate {
            limits,
            open: Mutex::new((0, HashMap::new())),
        })
    }

    /// Admits a connection from `ip`, or says which limit it is over.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<ConnPermit, &'static str> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.0 >= self.limits.max_connections {
            return Err("too many connections");
        }
        let per = open.1.get(&ip).copied().unwrap_or(0);
        if self.limits.max_connections_per_ip > 0 && per >= self.limits.max_connections_per_ip {
            return Err("too many connections from this address");
        }
        open.0 += 1;
        open.1.insert(ip, per + 1);
        Ok(ConnPermit {
            gate: self.clone(),
            ip,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).0
    }
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        let mut open = self.gate.open.lock().unwrap_or_else(|p| p.into_inner());
        open.0 = open.0.saturating_sub(1);
        if let Some(n) = open.1.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.1.remove(&self.ip);
            }
        }
    }
}

/// A request body that fails with `TimedOut` when it makes no progress for `stall` while
/// someone waits for it (a client that stops sending mid-body).
pub struct StallBody<B> {
    inner: B,
    stall: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<B> StallBody<B> {
    /// Wraps `inner`.
    pub fn new(inner: B, stall: Duration) -> StallBody<B> {
        StallBody {
            inner,
            stall,
            timer: None,
        }
    }
}

impl<B> Body for StallBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(r) => {
                this.timer = None;
                Poll::Ready(r.map(|r| r.map_err(io::Error::other)))
            }
            Poll::Pending => {
                let stall = this.stall;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the request body made no progress for {} s",
                            stall.as_secs_f64()
                        ),
                    )))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The answer to a connection over the limit (written without waiting, then closed).
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\n\
retry-after: 1\r\ncontent-type: text/plain\r\ncontent-length: 30\r\n\r\n\
too many connections; retry\r\n\r\n";

/// Serves HTTP/1.1 on `listener` with `limits` until `shutdown` resolves: each admitted
/// connection runs `make(peer)`'s service. Then stops accepting, lets connections finish
/// their requests (at most `grace`) and returns.
pub async fn serve<S, F, B>(
    listener: tokio::net::TcpListener,
    limits: Limits,
    make: F,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) where
    F: Fn(SocketAddr) -> S,
    S: hyper::service::Service<hyper::Request<Incoming>, Response = hyper::Response<B>>
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let gate = ConnGate::new(limits.clone());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut conns = tokio::task::JoinSet::new();
    let mut backoff = AcceptBackoff::new();
    tokio::pin!(shutdown);
    loop {
        // Reap finished connections so that the set does not grow without bound.
        while conns.try_join_next().is_some() {}
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            a = listener.accept() => a,
        };
        let (mut socket, peer) = match accepted {
            Ok(a) => {
                backoff.succeeded();
                a
            }
            Err(e) => {
                let wait = backoff.failed(&e);
                tracing::warn!(error = %e, wait_ms = wait.as_millis() as u64, "accept failed");
                if !wait.is_zero() {
                    tokio::select! {
                        _ = &mut shutdown => break,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
                continue;
            }
        };
        let permit = match gate.admit(peer.ip()) {
            Ok(p) => p,
            Err(why) => {
                tracing::warn!(%peer, why, "connection refused");
                // Best effort, without waiting: the socket is new, its buffer empty.
                let _ = socket.try_write(BUSY);
                let _ = socket.shutdown().await;
                continue;
            }
        };
        let _ = socket.set_nodelay(true);
        let service = make(peer);
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout);
        let mut stop = stop_rx.clone();
        conns.spawn(async move {
            let _permit = permit;
            let conn = builder.serve_connection(TokioIo::new(socket), service);
            tokio::pin!(conn);
            tokio::select! {
                // A client that goes away mid-request is not the server's failure.
                _ = conn.as_mut() => {}
                _ = stop.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drained =
        tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(
            open = conns.len(),
            "connections still busy after the grace period; closing them"
        );
        conns.abort_all();
    }
}

/// Errors of bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn backoff_grows_to_a_second_and_resets() {
        let mut b = AcceptBackoff::new();
        let emfile = io::Error::from_raw_os_error(libc::EMFILE);
        let mut waits = Vec::new();
        for _ in 0..10 {
            waits.push(b.failed(&emfile));
        }
        assert_eq!(waits[0], AcceptBackoff::MIN);
        assert!(waits.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*waits.last().unwrap(), AcceptBackoff::MAX);
        let total: Duration = waits.iter().sum();
        assert!(total > Duration::from_secs(3), "{total:?}");
        b.succeeded();
        assert_eq!(b.failed(&emfile), AcceptBackoff::MIN);
        let aborted = io::Error::from(io::ErrorKind::ConnectionAborted);
        assert_eq!(b.failed(&aborted), Duration::ZERO);
    }

    #[test]
    fn gate_counts_total_and_per_address() {
        let gate = ConnGate::new(Limits {
            max_connections: 3,
            max_connections_per_ip: 2,
            ..Limits::PAGES3
        });
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let p1 = gate.admit(a).unwrap();
        let _p2 = gate.admit(a).unwrap();
        assert!(gate.admit(a).is_err(), "third from one address");
        let _p3 = gate.admit(b).unwrap();
        assert!(gate.admit(b).is_err(), "fourth in total");
        drop(p1);
        assert_eq!(gate.open(), 2);
        let _p4 = gate.admit(a).unwrap();
    }
}
