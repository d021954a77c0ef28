//! The client side: a pool of quinn (tokio) connections, one per shard endpoint it talks to,
//! sending one request per bidirectional stream.

use bytes::Bytes;
use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

/// Why a call failed. Every variant means the request may not have been served; none is a
/// protocol answer (those come back in the reply).
///
/// Messages follow the convention of [`crate::Error`]: each is complete on its own (it quotes
/// the underlying error's text), and `source()` returns that underlying error, typed
/// ([`ConnectFailure`], [`TransferFailure`], [`ProtocolFailure`]).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Could not set up a connection (address, TLS or handshake problem, or unreachable), or
    /// the node refused this client.
    #[error("connecting to {0}: {1}")]
    Connect(SocketAddr, #[source] ConnectFailure),
    /// The connection or stream failed while the request was in flight.
    #[error("request to {0} failed: {1}")]
    Transfer(SocketAddr, #[source] TransferFailure),
    /// The reply was larger than allowed (the limit in bytes).
    #[error("reply from {0} exceeds {1} bytes")]
    TooLarge(SocketAddr, usize),
    /// No reply within the call timeout.
    #[error("no reply from {0} within {1:?}")]
    Timeout(SocketAddr, Duration),
    /// The reply was not a valid frame, or did not answer the request.
    #[error("bad reply from {0}: {1}")]
    Protocol(SocketAddr, #[source] ProtocolFailure),
}

impl ClientError {
    /// The endpoint the call went to.
    pub fn addr(&self) -> SocketAddr {
        match self {
            ClientError::Connect(a, _)
            | ClientError::Transfer(a, _)
            | ClientError::TooLarge(a, _)
            | ClientError::Timeout(a, _)
            | ClientError::Protocol(a, _) => *a,
        }
    }
}

/// Why a connection could not be set up ([`ClientError::Connect`]).
#[derive(Debug, thiserror::Error)]
pub enum ConnectFailure {
    /// quinn refused to start connecting (bad address, no client configuration, endpoint
    /// closing).
    #[error(transparent)]
    Setup(#[from] quinn::ConnectError),
    /// The handshake failed, or the connection was lost during it.
    #[error(transparent)]
    Handshake(quinn::ConnectionError),
    /// The node closed the connection for a reason this client can act on (its TLS
    /// certificate, a connection limit). The message explains the close and says what to do
    /// ([`refusal_reason`]) instead of quoting quinn's report of it, which is the source: a
    /// chain printer shows that report once, after the explanation.
    #[error("{}", refusal_reason(.0).unwrap_or_else(|| .0.to_string()))]
    Refused(#[source] quinn::ConnectionError),
}

impl From<quinn::ConnectionError> for ConnectFailure {
    /// [`ConnectFailure::Refused`] when [`refusal_reason`] explains `e`, else
    /// [`ConnectFailure::Handshake`].
    fn from(e: quinn::ConnectionError) -> ConnectFailure {
        if refusal_reason(&e).is_some() {
            ConnectFailure::Refused(e)
        } else {
            ConnectFailure::Handshake(e)
        }
    }
}

/// How a request's stream failed ([`ClientError::Transfer`]).
#[derive(Debug, thiserror::Error)]
pub enum TransferFailure {
    /// Opening the stream failed: the connection is gone.
    #[error(transparent)]
    Open(#[from] quinn::ConnectionError),
    /// Sending the request failed.
    #[error(transparent)]
    Write(#[from] quinn::WriteError),
    /// The send side was closed already when the request was finished.
    #[error(transparent)]
    Finish(#[from] quinn::ClosedStream),
    /// Reading the reply failed.
    #[error(transparent)]
    Read(#[from] quinn::ReadError),
}

/// What was wrong with a reply ([`ClientError::Protocol`]).
#[derive(Debug, thiserror::Error)]
pub enum ProtocolFailure {
    /// The request could not be encoded (too long a path, too large a field).
    #[error("cannot encode request: {0}")]
    Encode(#[source] pagestore_protocol::frame::FrameError),
    /// The reply is not a valid response frame.
    #[error("{0}")]
    Decode(#[source] pagestore_protocol::frame::FrameError),
    /// More bytes followed the reply frame on its stream.
    #[error("bytes after the reply frame")]
    TrailingBytes,
    /// The reply names another request than the one sent on its stream.
    #[error("response to request {answered} arrived on the stream of request {sent}")]
    WrongRequest {
        /// The request id the reply carries.
        answered: u64,
        /// The request id sent on the stream.
        sent: u64,
    },
    /// The reply is of a kind that does not answer the request (both shown as `Debug`).
    #[error("{response} does not answer {request}")]
    NotAnAnswer {
        /// The reply's body.
        response: String,
        /// The request's body.
        request: String,
    },
}

/// Why a node closed the connection, when the reason is one this client can act on: the node
/// refused this client's TLS certificate (or the lack of one), or refused the connection.
/// quinn reports both only as a closed connection ("connection lost" on a stream).
pub fn refusal_reason(e: &quinn::ConnectionError) -> Option<String> {
    let quinn::ConnectionError::ConnectionClosed(close) = e else {
        return None;
    };
    let code = u64::from(close.error_code);
    if code == u64::from(quinn::TransportErrorCode::CONNECTION_REFUSED) {
        return Some(
            "the node refused the connection (it is at its connection limit, overall or for \
             this client's IP address; see --max-connections and --max-connections-per-ip)"
                .into(),
        );
    }
    // TLS alerts travel as QUIC CRYPTO_ERROR 0x100 + alert.
    let alert = code.checked_sub(0x100).filter(|a| *a <= 0xff)?;
    let what = match alert {
        116 => "sent no client certificate (TLS alert certificate_required)",
        42 => "sent a certificate the node rejected (TLS alert bad_certificate)",
        43 => "sent an unsupported certificate (TLS alert unsupported_certificate)",
        44 => "sent a revoked certificate (TLS alert certificate_revoked)",
        45 => "sent an expired certificate (TLS alert certificate_expired)",
        46 => "sent a certificate the node could not verify (TLS alert certificate_unknown)",
        48 => "sent a certificate not issued by the cluster CA (TLS alert unknown_ca)",
        49 => "was denied access (TLS alert access_denied)",
        _ => return None,
    };
    Some(format!(
        "the node requires a client certificate from the cluster CA, and this client {what}; \
         give the client the cluster's client-cert.pem and client-key.pem (issued by the \
         cluster CA) in its --tls-dir (or PAGESTORE_TLS_DIR)"
    ))
}

/// Pool settings.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// TLS server name to ask for (see [`pagestore_protocol::tls::SERVER_NAME`]).
    pub server_name: String,
    /// Largest reply accepted.
    pub max_reply: usize,
    /// Time allowed for one call, connection set-up included.
    pub timeout: Duration,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            server_name: pagestore_protocol::tls::SERVER_NAME.to_string(),
            max_reply: (64 << 20) + (64 << 10),
            timeout: Duration::from_secs(30),
        }
    }
}

/// One connection per endpoint address, opened on first use and replaced when it closes.
/// Cheap to share (`Arc`) between tasks; every call is one QUIC stream, so calls to one shard
/// run concurrently on one connection.
pub struct Pool {
    endpoint: quinn::Endpoint,
    conns: Mutex<HashMap<SocketAddr, quinn::Connection>>,
    /// One lock per connection, held while a request with a payload (a write) is sent: a
    /// node reads a connection's requests within a bounded budget, so their bytes must arrive
    /// one request after another, not interleaved (requests without payload are a few bytes
    /// and are not held back).
    writers: Mutex<HashMap<usize, Arc<tokio::sync::Mutex<()>>>>,
    /// Buffers of large replies, kept for the next ones (see [`ReplyBuffers`]).
    buffers: Arc<ReplyBuffers>,
    options: PoolOptions,
}

/// Replies at least this large are read into a kept buffer ([`ReplyBuffers`]).
const KEEP_FROM: usize = 256 << 10;
/// Bytes of free reply buffers kept at most.
const KEEP_AT_MOST: usize = 64 << 20;

/// Free buffers of large replies (pages), reused for the next ones: a fresh multi-megabyte
/// allocation is mapped by the system allocator and faulted in page by page on every reply, then
/// unmapped when it is dropped, which costs more CPU than copying the page into it. A reply's
/// bytes go back here when the last `Bytes` viewing them is dropped. At most [`KEEP_AT_MOST`]
/// bytes are kept; more are freed.
#[derive(Debug, Default)]
struct ReplyBuffers {
    free: Mutex<(Vec<Vec<u8>>, usize)>,
}

impl ReplyBuffers {
    /// An empty buffer with room for at least `len` bytes.
    fn take(&self, len: usize) -> Vec<u8> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = free.0.iter().position(|b| b.capacity() >= len) {
            let b = free.0.swap_remove(i);
            free.1 -= b.capacity();
            return b;
        }
        drop(free);
        Vec::with_capacity(len)
    }

    /// Keeps `b` for a later reply, unless that would keep too much.
    fn give(&self, mut b: Vec<u8>) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.1 + b.capacity() <= KEEP_AT_MOST {
            b.clear();
            free.1 += b.capacity();
            free.0.push(b);
        }
    }
}

/// A reply read into a kept buffer; gives the buffer back when dropped.
struct KeptReply {
    bytes: Vec<u8>,
    home: Arc<ReplyBuffers>,
}

impl AsRef<[u8]> for KeptReply {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for KeptReply {
    fn drop(&mut self) {
        self.home.give(std::mem::take(&mut self.bytes));
    }
}

impl Pool {
    /// A pool with its own UDP socket bound to `bind` (e.g. `127.0.0.1:0`). Must be called
    /// inside a tokio runtime.
    pub fn new(
        config: quinn::ClientConfig,
        bind: SocketAddr,
        options: PoolOptions,
    ) -> std::io::Result<Arc<Pool>> {
        let socket = std::net::UdpSocket::bind(bind)?;
        let runtime = quinn::default_runtime()
            .ok_or_else(|| std::io::Error::other("no async runtime found (call inside tokio)"))?;
        let mut endpoint = quinn::Endpoint::new(
            pagestore_protocol::transport::endpoint_config(),
            None,
            socket,
            runtime,
        )?;
        endpoint.set_default_client_config(config);
        Ok(Arc::new(Pool {
            endpoint,
            conns: Mutex::new(HashMap::new()),
            writers: Mutex::new(HashMap::new()),
            buffers: Arc::default(),
            options,
        }))
    }

    fn cached(&self, addr: SocketAddr) -> Option<quinn::Connection> {
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns
            .get(&addr)
            .filter(|c| c.close_reason().is_none())
            .cloned()
    }

    /// The live connection to `addr`, connecting if there is none.
    pub async fn connection(&self, addr: SocketAddr) -> Result<quinn::Connection, ClientError> {
        if let Some(c) = self.cached(addr) {
            return Ok(c);
        }
        let connecting = self
            .endpoint
            .connect(addr, &self.options.server_name)
            .map_err(|e| ClientError::Connect(addr, e.into()))?;
        let conn = connecting
            .await
            .map_err(|e| ClientError::Connect(addr, e.into()))?;
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        match conns.get(&addr) {
            // Another task connected first: use that one.
            Some(other) if other.close_reason().is_none() => {
                conn.close(0u32.into(), b"duplicate");
                Ok(other.clone())
            }
            _ => {
                conns.insert(addr, conn.clone());
                Ok(conn)
            }
        }
    }

    /// Sends `request` then `payload` on a new stream to `addr` and returns the whole reply.
    pub async fn call(
        &self,
        addr: SocketAddr,
        request: &[u8],
        payload: Bytes,
    ) -> Result<Bytes, ClientError> {
        self.call_within(addr, request, payload, self.options.timeout)
            .await
    }

    /// [`Pool::call`] with its own time allowance instead of [`PoolOptions::timeout`].
    pub async fn call_within(
        &self,
        addr: SocketAddr,
        request: &[u8],
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, ClientError> {
        match tokio::time::timeout(timeout, self.call_inner(addr, request, payload)).await {
            Ok(r) => r,
            Err(_) => {
                // The connection may lead to a process that is gone (a member restarted on the
                // same port does not know it): the next request connects afresh. Requests in
                // flight on it go on.
                self.forget(addr);
                Err(ClientError::Timeout(addr, timeout))
            }
        }
    }

    /// Bytes this client has received on its connection to `addr` so far (datagrams, every
    /// stream and ACK included), if it has one: a member whose count grows is sending, however
    /// long its answers take to complete.
    pub fn received(&self, addr: SocketAddr) -> Option<u64> {
        self.cached(addr).map(|c| c.stats().udp_rx.bytes)
    }

    /// Drops the cached connection to `addr` (if any), so that the next request connects
    /// afresh; requests in flight on it are not interrupted.
    pub fn forget(&self, addr: SocketAddr) {
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns.remove(&addr);
    }

    /// Whether nothing listens at `addr` any more: a one-byte datagram sent there from a
    /// connected UDP socket of its own is refused within `wait` (the host answered ICMP port
    /// unreachable, as it does for a process that is gone). A process that is alive but stopped
    /// or starved still holds its socket, so it is never refused; a host that is gone, or a
    /// network that drops ICMP, answers nothing, and that says nothing either (`false`). The
    /// byte is not a QUIC packet: a node drops it unread.
    pub async fn port_refused(&self, addr: SocketAddr, wait: Duration) -> bool {
        let refused = |e: &std::io::Error| e.kind() == std::io::ErrorKind::ConnectionRefused;
        let ip = match self.endpoint.local_addr() {
            Ok(local) if local.is_ipv4() == addr.is_ipv4() => local.ip(),
            _ if addr.is_ipv4() => std::net::Ipv4Addr::UNSPECIFIED.into(),
            _ => std::net::Ipv6Addr::UNSPECIFIED.into(),
        };
        let Ok(socket) = tokio::net::UdpSocket::bind(SocketAddr::new(ip, 0)).await else {
            return false;
        };
        if socket.connect(addr).await.is_err() {
            return false;
        }
        if let Err(e) = socket.send(&[0]).await {
            return refused(&e);
        }
        let mut answer = [0u8; 64];
        matches!(
            tokio::time::timeout(wait, socket.recv(&mut answer)).await,
            Ok(Err(e)) if refused(&e)
        )
    }
    async fn call_inner(
        &self,
        addr: SocketAddr,
        request: &[u8],
        payload: Bytes,
    ) -> Result<Bytes, ClientError> {
        // A cached connection may belong to an earlier life of the member (it restarted): when
        // it turns out closed, try once more on a fresh connection.
        if let Some(conn) = self.cached(addr) {
            match self.exchange(&conn, addr, request, payload.clone()).await {
                Err(ClientError::Transfer(..)) if conn.close_reason().is_some() => {}
                r => return r,
            }
        }
        let conn = self.connection(addr).await?;
        self.exchange(&conn, addr, request, payload).await
    }

    /// One request and its reply on one stream of `conn`.
    async fn exchange(
        &self,
        conn: &quinn::Connection,
        addr: SocketAddr,
        request: &[u8],
        payload: Bytes,
    ) -> Result<Bytes, ClientError> {
        // A stream error on a closed connection says only "connection lost": name the reason
        // when the node refused this client.
        let xfer = |e: TransferFailure| match conn.close_reason() {
            Some(close) if refusal_reason(&close).is_some() => {
                ClientError::Connect(addr, ConnectFailure::Refused(close))
            }
            _ => ClientError::Transfer(addr, e),
        };
        let writer = if payload.is_empty() {
            None
        } else {
            let lock = {
                let mut w = self.writers.lock().unwrap_or_else(|p| p.into_inner());
                w.retain(|_, l| Arc::strong_count(l) > 1);
                w.entry(conn.stable_id()).or_default().clone()
            };
            Some(lock.lock_owned().await)
        };
        let (mut send, mut recv) = conn.open_bi().await.map_err(|e| xfer(e.into()))?;
        send.write_all(request).await.map_err(|e| xfer(e.into()))?;
        if !payload.is_empty() {
            // Handed to quinn as it is: no copy into its send buffer.
            send.write_chunk(payload)
                .await
                .map_err(|e| xfer(e.into()))?;
        }
        send.finish().map_err(|e| xfer(e.into()))?;
        drop(writer);
        // Replies are frames: the preamble says how long the whole frame is, so the buffer is
        // allocated once at its final size (no regrowth, no extra copies).
        let mut buf = vec![0u8; pagestore_protocol::frame::PREAMBLE_LEN];
        let mut got = 0;
        while got < buf.len() {
            match recv
                .read(&mut buf[got..])
                .await
                .map_err(|e| xfer(e.into()))?
            {
                Some(n) => got += n,
                None => {
                    buf.truncate(got);
                    return Ok(buf.into());
                }
            }
        }
        // Not a frame: read what there is (bounded) and let the caller judge it.
        let total = pagestore_protocol::frame::Preamble::decode_prefix(&buf)
            .map_or(self.options.max_reply, |p| p.frame_len());
        if total > self.options.max_reply {
            return Err(ClientError::TooLarge(addr, self.options.max_reply));
        }
        // quinn's chunks are appended as they come: one copy per byte, and no zero-fill first.
        // A large reply goes into a kept buffer (see `ReplyBuffers`).
        let kept = total >= KEEP_FROM;
        if kept {
            let mut b = self.buffers.take(total);
            b.extend_from_slice(&buf);
            buf = b;
        } else {
            buf.reserve_exact(total - got);
        }
        while got < total {
            match recv
                .read_chunk(total - got, true)
                .await
                .map_err(|e| xfer(e.into()))?
            {
                Some(chunk) => {
                    buf.extend_from_slice(&chunk.bytes);
                    got += chunk.bytes.len();
                }
                None => break,
            }
        }
        if got == total
            && recv
                .read(&mut [0u8; 1])
                .await
                .map_err(|e| xfer(e.into()))?
                .is_some()
        {
            return Err(ClientError::Protocol(addr, ProtocolFailure::TrailingBytes));
        }
        Ok(if kept {
            Bytes::from_owner(KeptReply {
                bytes: buf,
                home: self.buffers.clone(),
            })
        } else {
            buf.into()
        })
    }

    /// Sends one request frame (and its payload) and decodes the response frame. Returns the
    /// response and its payload bytes: a view into the buffer the reply was read into (no copy).
    pub async fn request(
        &self,
        addr: SocketAddr,
        request: &pagestore_protocol::frame::Request,
        payload: Bytes,
    ) -> Result<(pagestore_protocol::frame::Response, Bytes), ClientError> {
        self.request_within(addr, request, payload, self.options.timeout)
            .await
    }

    /// [`Pool::request`] with its own time allowance instead of [`PoolOptions::timeout`].
    pub async fn request_within(
        &self,
        addr: SocketAddr,
        request: &pagestore_protocol::frame::Request,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<(pagestore_protocol::frame::Response, Bytes), ClientError> {
        let proto = |f: ProtocolFailure| ClientError::Protocol(addr, f);
        let mut head = Vec::with_capacity(128);
        pagestore_protocol::frame::encode_request(request, payload.len() as u32, &mut head)
            .map_err(|e| proto(ProtocolFailure::Encode(e)))?;
        let raw = self.call_within(addr, &head, payload, timeout).await?;
        let (response, range) = pagestore_protocol::frame::decode_response_frame(&raw)
            .map_err(|e| proto(ProtocolFailure::Decode(e)))?;
        if response.request_id != request.request_id && response.request_id != 0 {
            return Err(proto(ProtocolFailure::WrongRequest {
                answered: response.request_id,
                sent: request.request_id,
            }));
        }
        if !response.body.answers(&request.body) {
            return Err(proto(ProtocolFailure::NotAnAnswer {
                response: format!("{:?}", response.body),
                request: format!("{:?}", request.body),
            }));
        }
        let body = raw.slice(range);
        Ok((response, body))
    }

    /// Closes every connection.
    pub fn close(&self) {
        self.endpoint.close(0u32.into(), b"client closing");
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_reply_gives_its_buffer_back_for_the_next_one() {
        let home = Arc::new(ReplyBuffers::default());
        let mut first = home.take(1 << 20);
        first.extend_from_slice(&[5u8; 1 << 20]);
        let at = first.as_ptr();
        let reply = Bytes::from_owner(KeptReply {
            bytes: first,
            home: home.clone(),
        });
        let view = reply.slice(10..20);
        drop(reply);
        // A slice still views the buffer: nothing is given back yet.
        assert!(home.free.lock().unwrap().0.is_empty());
        assert_eq!(&view[..], &[5u8; 10]);
        drop(view);
        assert_eq!(home.free.lock().unwrap().1, 1 << 20);
        // The next reply of that size or smaller reuses it, emptied; a larger one does not.
        let again = home.take(1 << 19);
        assert_eq!((again.as_ptr(), again.len()), (at, 0));
        assert_eq!(home.free.lock().unwrap().1, 0);
        home.give(again);
        assert!(home.take(2 << 20).capacity() >= 2 << 20);
        assert_eq!(home.free.lock().unwrap().0.len(), 1);
    }

    #[test]
    fn no_more_than_keep_at_most_bytes_are_kept() {
        let home = ReplyBuffers::default();
        for _ in 0..(KEEP_AT_MOST / (4 << 20)) + 3 {
            home.give(Vec::with_capacity(4 << 20));
        }
        let kept = home.free.lock().unwrap().1;
        assert!(
            kept <= KEEP_AT_MOST && kept > KEEP_AT_MOST - (4 << 20),
            "{kept}"
        );
    }
}
