//! A per-shard QUIC endpoint, driven by quinn-proto (quinn's sans-IO state machine) on the
//! shard's own glommio executor: its own UDP socket, its own connections, its own timers.
//!
//! quinn's high-level `Endpoint` needs `Send + Sync` runtime types that glommio does not have,
//! so this module is the glue: one driver task per shard receives datagrams (GRO) with
//! quinn-udp on a non-blocking socket, feeds them to quinn-proto, accepts bidirectional streams
//! (one request each), hands complete requests to a [`Service`] running on the same executor,
//! writes the replies back, and sends what quinn-proto wants sent (GSO). Nothing crosses cores.
//!
//! Readiness: glommio has no public "wait until readable" API. The driver waits on a 1-byte
//! `peek_from` of a glommio socket sharing the same file (a peek consumes nothing), then drains
//! the socket with non-blocking `recvmsg` calls. The socket is made without SO_REUSEPORT, so a
//! second process cannot silently share the port.

use std::{
    cell::{Cell, RefCell},
    collections::{HashMap, VecDeque},
    future::Future,
    io::{self, IoSliceMut},
    net::SocketAddr,
    pin::Pin,
    rc::Rc,
    sync::Arc,
    time::{Duration, Instant},
};

use crate::tls::{peer_role, Role};
use bytes::BytesMut;
use pagestore_engine::{event::Event, PageData};
use quinn_proto::{
    ConnectionHandle, DatagramEvent, Dir, Event as QEvent, ReadError, ServerConfig, StreamEvent,
    StreamId, VarInt, WriteError,
};
use rustls::pki_types::CertificateDer;

/// The body of a reply: nothing, bytes owned by the reply, or a page read from the cache (sent
/// from the buffer the disk read went into).
pub enum Body {
    /// No body.
    Empty,
    /// Owned bytes.
    Bytes(Vec<u8>),
    /// A cached page (or part of one).
    Page(PageData),
    /// Shared bytes (a page just loaded from the under storage).
    Shared(bytes::Bytes),
}

impl Body {
    fn as_slice(&self) -> &[u8] {
        match self {
            Body::Empty => &[],
            Body::Bytes(b) => b,
            Body::Page(p) => p,
            Body::Shared(b) => b,
        }
    }
}

/// A reply: a frame head and a body, written to the request's stream in that order.
pub struct Reply {
    /// Encoded response frame head (preamble and header).
    pub head: Vec<u8>,
    /// Payload.
    pub body: Body,
}

/// Who sent a request: established once per connection, from the TLS handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The peer's address.
    pub addr: SocketAddr,
    /// What the peer's certificate allows ([`Role::Reader`] without one).
    pub role: Role,
}

/// What a shard does with one request. Runs on the shard's executor.
pub trait Service: 'static {
    /// Answers one complete request (everything the client wrote on the stream) from `peer`.
    fn call(self: Rc<Self>, request: Vec<u8>, peer: Peer) -> Pin<Box<dyn Future<Output = Reply>>>;
}

/// Settings of one endpoint.
#[derive(Clone)]
pub struct EndpointOptions {
    /// Address to bind (one per shard: base port + shard index).
    pub addr: SocketAddr,
    /// TLS and transport settings for accepted connections.
    pub server: Arc<ServerConfig>,
    /// Largest request accepted (frame head and payload); a larger one resets the stream.
    pub max_request: usize,
    /// Bytes of partly received requests one connection may make the shard hold: it may have
    /// `max_buffered / max_request` (at least one) requests partly read at once; further streams
    /// wait unread and QUIC flow control holds the client back.
    pub max_buffered: usize,
}

/// Counters of one endpoint.
#[derive(Default, Debug)]
pub struct EndpointStats {
    /// Connections accepted.
    pub connections: Cell<u64>,
    /// Requests handed to the service.
    pub requests: Cell<u64>,
    /// Streams reset because a request was too large or malformed at the stream level.
    pub rejected: Cell<u64>,
    /// Datagrams received.
    pub datagrams_in: Cell<u64>,
    /// Datagram batches sent.
    pub sends: Cell<u64>,
}

/// A running endpoint (owned by the shard that started it).
pub struct EndpointHandle {
    local_addr: SocketAddr,
    stats: Rc<EndpointStats>,
    closing: Rc<Cell<bool>>,
    wake: Rc<Event>,
    done: Rc<Event>,
    finished: Rc<Cell<bool>>,
}

impl EndpointHandle {
    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Counters.
    pub fn stats(&self) -> &EndpointStats {
        &self.stats
    }

    /// Closes every connection and stops the driver; resolves once it has stopped.
    pub async fn close(&self) {
        self.closing.set(true);
        self.wake.notify_all();
        while !self.finished.get() {
            self.done.listen().await;
        }
    }
}

enum StreamState {
    Reading(Vec<u8>),
    Serving,
    Writing { reply: Reply, written: usize },
}

struct Conn {
    conn: quinn_proto::Connection,
    /// The peer, once its handshake is complete (streams only open after it).
    peer: Option<Peer>,
    streams: HashMap<StreamId, StreamState>,
    /// Streams whose request is partly read. At most `max_buffered / max_request` at once, so a
    /// peer cannot make the shard buffer many large requests: other streams wait unread (their
    /// data stays in quinn-proto, where flow control holds the peer back), and each admitted one
    /// is read to its end, so the connection always makes progress.
    active: usize,
    /// Streams waiting for a free place; retried as places free up.
    paused: Vec<StreamId>,
}

type Done = Rc<RefCell<VecDeque<(ConnectionHandle, StreamId, Reply)>>>;

/// The endpoint's UDP socket and quinn-udp's state for it (GSO, GRO, ECN).
struct Udp {
    socket: socket2::Socket,
    state: quinn_udp::UdpSocketState,
    stats: Rc<EndpointStats>,
}

impl Udp {
    /// Sends one transmit (possibly a GSO batch) that quinn-proto wrote into `buf`.
    fn send(&self, t: &quinn_proto::Transmit, buf: &[u8]) {
        let transmit = quinn_udp::Transmit {
            destination: t.destination,
            ecn: t.ecn.map(|e| match e {
                quinn_proto::EcnCodepoint::Ect0 => quinn_udp::EcnCodepoint::Ect0,
                quinn_proto::EcnCodepoint::Ect1 => quinn_udp::EcnCodepoint::Ect1,
                quinn_proto::EcnCodepoint::Ce => quinn_udp::EcnCodepoint::Ce,
            }),
            contents: &buf[..t.size],
            segment_size: t.segment_size,
            src_ip: t.src_ip,
        };
        self.stats.sends.set(self.stats.sends.get() + 1);
        // A full socket buffer drops the batch; QUIC loss recovery resends it.
        let _ = self.state.send((&self.socket).into(), &transmit);
    }
}

struct Driver {
    endpoint: quinn_proto::Endpoint,
    conns: HashMap<ConnectionHandle, Conn>,
    out: Udp,
    service: Rc<dyn Service>,
    done: Done,
    wake: Rc<Event>,
    stats: Rc<EndpointStats>,
    max_request: usize,
    max_buffered: usize,
    recv_buf: Vec<u8>,
    send_buf: Vec<u8>,
}

fn bind(addr: SocketAddr) -> io::Result<socket2::Socket> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    if addr.is_ipv6() {
        s.set_only_v6(false)?;
    }
    // Large buffers absorb bursts of full-size page responses; best effort.
    let _ = s.set_recv_buffer_size(8 << 20);
    let _ = s.set_send_buffer_size(8 << 20);
    s.bind(&addr.into())?;
    s.set_nonblocking(true)?;
    Ok(s)
}

/// Starts an endpoint on the current glommio executor (call it from the shard, e.g. from the
/// engine's `ShardInit` hook). Fails if the address cannot be bound.
pub fn start(options: EndpointOptions, service: Rc<dyn Service>) -> io::Result<EndpointHandle> {
    let socket = bind(options.addr)?;
    let local_addr = socket
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("bound socket has no IP address"))?;
    let udp = quinn_udp::UdpSocketState::new((&socket).into())?;
    let readable = {
        use std::os::fd::{FromRawFd, IntoRawFd};
        let fd = socket.try_clone()?.into_raw_fd();
        // SAFETY: `fd` is a fresh duplicate of our socket's descriptor, owned by nobody else;
        // the glommio socket takes ownership and closes it when dropped.
        unsafe { glommio::net::UdpSocket::from_raw_fd(fd) }
    };
    let endpoint = quinn_proto::Endpoint::new(
        Arc::new(crate::transport::endpoint_config()),
        Some(options.server.clone()),
        true,
        None,
    );
    let gro = udp.gro_segments().max(1);
    let stats = Rc::new(EndpointStats::default());
    let wake = Rc::new(Event::default());
    let closing = Rc::new(Cell::new(false));
    let done_ev = Rc::new(Event::default());
    let finished = Rc::new(Cell::new(false));
    let mut driver = Driver {
        endpoint,
        conns: HashMap::new(),
        out: Udp {
            socket,
            state: udp,
            stats: stats.clone(),
        },
        service,
        done: Rc::new(RefCell::new(VecDeque::new())),
        wake: wake.clone(),
        stats: stats.clone(),
        max_request: options.max_request,
        max_buffered: options.max_buffered.max(options.max_request),
        recv_buf: vec![0u8; 65_536 * gro],
        send_buf: Vec::with_capacity(65_536),
    };
    let (c, d, f) = (closing.clone(), done_ev.clone(), finished.clone());
    glommio::spawn_local(async move {
        if let Err(e) = driver.run(&readable, &c).await {
            tracing::error!(error = %e, addr = %local_addr, "QUIC endpoint stopped");
        }
        f.set(true);
        d.notify_all();
    })
    .detach();
    Ok(EndpointHandle {
        local_addr,
        stats,
        closing,
        wake,
        done: done_ev,
        finished,
    })
}

impl Driver {
    async fn run(
        &mut self,
        readable: &glommio::net::UdpSocket,
        closing: &Cell<bool>,
    ) -> io::Result<()> {
        // Shutdown happens in two steps. First every open stream is reset, so no reply data is
        // left to send. Only after the resets have had a few round trips to leave is each
        // connection closed: quinn-proto subjects a close packet that shares a flight with
        // pending data to congestion control, and a close stuck behind a full window never
        // leaves before the close timer drains the connection; the client would then wait for
        // its idle timeout instead of learning at once that the node is gone.
        let mut closing_since: Option<Instant> = None;
        let mut close_at: HashMap<ConnectionHandle, Instant> = HashMap::new();
        loop {
            let now = Instant::now();
            if closing.get() && closing_since.is_none() {
                closing_since = Some(now);
                for (ch, c) in self.conns.iter_mut() {
                    for id in c.streams.keys() {
                        let _ = c.conn.send_stream(*id).reset(VarInt::from_u32(0));
                    }
                    c.streams.clear();
                    let settle = (c.conn.rtt() * 4 + Duration::from_millis(25))
                        .min(Duration::from_millis(500));
                    close_at.insert(*ch, now + settle);
                }
            }
            close_at.retain(|ch, at| {
                if *at > now {
                    return true;
                }
                if let Some(c) = self.conns.get_mut(ch) {
                    c.conn.close(
                        now,
                        VarInt::from_u32(0),
                        bytes::Bytes::from_static(b"shutdown"),
                    );
                }
                false
            });
            let mut work = self.receive(now)?;
            work |= self.take_replies();
            let handles: Vec<ConnectionHandle> = self.conns.keys().copied().collect();
            for ch in handles {
                work |= self.drive(ch, now);
            }
            if let Some(t) = closing_since {
                if self.conns.is_empty() || t.elapsed() > Duration::from_secs(3) {
                    return Ok(());
                }
            }
            if work {
                // Cooperative: let request tasks run between driver turns.
                futures_lite::future::yield_now().await;
                continue;
            }
            let deadline = self
                .conns
                .values_mut()
                .filter_map(|c| c.conn.poll_timeout())
                .chain(close_at.values().copied())
                .min();
            let wait =
                deadline.map_or(Duration::from_secs(1), |d| d.saturating_duration_since(now));
            let mut peek = [0u8; 1];
            let listen = self.wake.listen();
            futures_lite::future::or(
                async {
                    let _ = readable.peek_from(&mut peek).await;
                },
                futures_lite::future::or(listen, async {
                    glommio::timer::sleep(wait).await;
                }),
            )
            .await;
        }
    }

    /// Reads every datagram waiting on the socket.
    fn receive(&mut self, now: Instant) -> io::Result<bool> {
        let mut any = false;
        loop {
            let mut meta = [quinn_udp::RecvMeta::default()];
            let n = {
                let mut bufs = [IoSliceMut::new(&mut self.recv_buf)];
                match self
                    .out
                    .state
                    .recv((&self.out.socket).into(), &mut bufs, &mut meta)
                {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(any),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    // ICMP errors (e.g. a client went away) surface here; they are not ours.
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
                    // Anything else (ENOBUFS, ENOMEM, ...) is transient for a UDP socket: log it
                    // and carry on; the endpoint must not stop serving over one failed receive.
                    Err(e) => {
                        tracing::warn!(error = %e, "UDP receive failed");
                        return Ok(any);
                    }
                }
            };
            any = true;
            for m in &meta[..n] {
                let stride = m.stride.max(1);
                let mut off = 0;
                while off < m.len {
                    let end = (off + stride).min(m.len);
                    let data = BytesMut::from(&self.recv_buf[off..end]);
                    self.stats
                        .datagrams_in
                        .set(self.stats.datagrams_in.get() + 1);
                    self.handle_datagram(now, m.addr, m.dst_ip, m.ecn, data);
                    off = end;
                }
            }
        }
    }

    fn handle_datagram(
        &mut self,
        now: Instant,
        from: SocketAddr,
        dst_ip: Option<std::net::IpAddr>,
        ecn: Option<quinn_udp::EcnCodepoint>,
        data: BytesMut,
    ) {
        let ecn = ecn.and_then(|e| quinn_proto::EcnCodepoint::from_bits(e as u8));
        let mut buf = Vec::new();
        match self.endpoint.handle(now, from, dst_ip, ecn, data, &mut buf) {
            Some(DatagramEvent::NewConnection(incoming)) => {
                match self.endpoint.accept(incoming, now, &mut buf, None) {
                    Ok((ch, conn)) => {
                        self.stats.connections.set(self.stats.connections.get() + 1);
                        self.conns.insert(
                            ch,
                            Conn {
                                conn,
                                peer: None,
                                streams: HashMap::new(),
                                active: 0,
                                paused: Vec::new(),
                            },
                        );
                    }
                    Err(e) => {
                        if let Some(t) = e.response {
                            self.out.send(&t, &buf);
                        }
                    }
                }
            }
            Some(DatagramEvent::ConnectionEvent(ch, ev)) => {
                if let Some(c) = self.conns.get_mut(&ch) {
                    c.conn.handle_event(ev);
                }
            }
            Some(DatagramEvent::Response(t)) => self.out.send(&t, &buf),
            None => {}
        }
    }

    /// Moves finished replies from the service tasks onto their streams.
    fn take_replies(&mut self) -> bool {
        let mut any = false;
        loop {
            let next = self.done.borrow_mut().pop_front();
            let Some((ch, id, reply)) = next else {
                return any;
            };
            any = true;
            if let Some(c) = self.conns.get_mut(&ch) {
                if let Some(s) = c.streams.get_mut(&id) {
                    *s = StreamState::Writing { reply, written: 0 };
                    write_stream(c, id);
                }
            }
        }
    }

    /// Runs one connection: timers, events, new streams, reads, writes, transmits.
    fn drive(&mut self, ch: ConnectionHandle, now: Instant) -> bool {
        let mut work = false;
        let Some(c) = self.conns.get_mut(&ch) else {
            return false;
        };
        if c.conn.poll_timeout().is_some_and(|t| t <= now) {
            c.conn.handle_timeout(now);
            work = true;
        }
        while let Some(ev) = c.conn.poll_endpoint_events() {
            if let Some(back) = self.endpoint.handle_event(ch, ev) {
                c.conn.handle_event(back);
            }
        }
        let mut readable = Vec::new();
        while let Some(ev) = c.conn.poll() {
            work = true;
            match ev {
                QEvent::Stream(StreamEvent::Readable { id }) => readable.push(id),
                QEvent::Stream(StreamEvent::Writable { id }) => write_stream(c, id),
                QEvent::Stream(StreamEvent::Stopped { id, .. }) => {
                    if let Some(StreamState::Reading(b)) = c.streams.remove(&id) {
                        if !b.is_empty() {
                            c.active -= 1;
                        }
                    }
                }
                _ => {}
            }
        }
        while let Some(id) = c.conn.streams().accept(Dir::Bi) {
            c.streams.insert(id, StreamState::Reading(Vec::new()));
            readable.push(id);
            work = true;
        }
        let places = (self.max_buffered / self.max_request.max(1)).max(1);
        if c.active < places && !c.paused.is_empty() {
            readable.append(&mut c.paused);
        }
        for id in readable {
            if let Some(request) = read_stream(c, id, self.max_request, places, &self.stats) {
                self.stats.requests.set(self.stats.requests.get() + 1);
                // QUIC processes no 1-RTT stream data before the handshake completes; should a
                // request still arrive first, it is served as a reader's and the role is
                // looked up again for the next one.
                if c.peer.is_none() && !c.conn.is_handshaking() {
                    c.peer = Some(peer_of(&c.conn));
                }
                let peer = c.peer.unwrap_or(Peer {
                    addr: c.conn.remote_address(),
                    role: Role::Reader,
                });
                let service = self.service.clone();
                let done = self.done.clone();
                let wake = self.wake.clone();
                glommio::spawn_local(async move {
                    let reply = service.call(request, peer).await;
                    done.borrow_mut().push_back((ch, id, reply));
                    wake.notify_all();
                })
                .detach();
            }
        }
        // Transmit.
        loop {
            self.send_buf.clear();
            let segments = crate::transport::gso_segments(
                c.conn.current_mtu(),
                self.out.state.max_gso_segments(),
            );
            let tr = c.conn.poll_transmit(now, segments, &mut self.send_buf);
            match tr {
                Some(t) => {
                    self.out.send(&t, &self.send_buf);
                    work = true;
                }
                None => break,
            }
        }
        if c.conn.is_drained() {
            self.conns.remove(&ch);
        }
        work
    }
}

/// The peer of an established connection: its address and the role its certificate (verified
/// against the cluster CA during the handshake) carries.
fn peer_of(conn: &quinn_proto::Connection) -> Peer {
    let chain = conn
        .crypto_session()
        .peer_identity()
        .and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok());
    Peer {
        addr: conn.remote_address(),
        role: peer_role(chain.as_deref().map(Vec::as_slice)),
    }
}

/// Reads what has arrived on a request stream, if the stream has (or can get) one of the
/// connection's `places` for partly read requests. Returns the whole request once the client
/// has finished its side.
fn read_stream(
    c: &mut Conn,
    id: StreamId,
    max: usize,
    places: usize,
    stats: &EndpointStats,
) -> Option<Vec<u8>> {
    let Some(StreamState::Reading(buf)) = c.streams.get_mut(&id) else {
        return None;
    };
    let was_active = !buf.is_empty();
    if !was_active && c.active >= places {
        if !c.paused.contains(&id) {
            c.paused.push(id);
        }
        return None;
    }
    let mut fin = false;
    let mut fail = false;
    {
        let mut recv = c.conn.recv_stream(id);
        let mut chunks = match recv.read(true) {
            Ok(ch) => ch,
            Err(_) => {
                if was_active {
                    c.active -= 1;
                }
                c.streams.remove(&id);
                return None;
            }
        };
        loop {
            match chunks.next(usize::MAX) {
                Ok(Some(chunk)) => {
                    if buf.len() + chunk.bytes.len() > max {
                        fail = true;
                        break;
                    }
                    buf.extend_from_slice(&chunk.bytes);
                }
                Ok(None) => {
                    fin = true;
                    break;
                }
                Err(ReadError::Blocked) => break,
                Err(ReadError::Reset(_)) => {
                    fail = true;
                    break;
                }
            }
        }
        let _ = chunks.finalize();
    }
    let is_active = !buf.is_empty();
    if fail || fin {
        if was_active {
            c.active -= 1;
        }
    } else if is_active && !was_active {
        c.active += 1;
    }
    if fail {
        stats.rejected.set(stats.rejected.get() + 1);
        let _ = c.conn.recv_stream(id).stop(VarInt::from_u32(1));
        let _ = c.conn.send_stream(id).reset(VarInt::from_u32(1));
        c.streams.remove(&id);
        return None;
    }
    if !fin {
        return None;
    }
    match c.streams.insert(id, StreamState::Serving) {
        Some(StreamState::Reading(buf)) => Some(buf),
        _ => None,
    }
}

/// Writes as much of a reply as flow control allows; finishes the stream when all is written.
fn write_stream(c: &mut Conn, id: StreamId) {
    let Some(StreamState::Writing { reply, written }) = c.streams.get_mut(&id) else {
        return;
    };
    let head = reply.head.len();
    let total = head + reply.body.as_slice().len();
    let mut send = c.conn.send_stream(id);
    while *written < total {
        let slice = if *written < head {
            &reply.head[*written..]
        } else {
            &reply.body.as_slice()[*written - head..]
        };
        match send.write(slice) {
            Ok(n) => *written += n,
            Err(WriteError::Blocked) => return,
            Err(_) => {
                c.streams.remove(&id);
                return;
            }
        }
    }
    let _ = send.finish();
    c.streams.remove(&id);
}
