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
    collections::{HashMap, HashSet, VecDeque},
    future::Future,
    io::{self, IoSliceMut},
    net::{IpAddr, SocketAddr},
    pin::Pin,
    rc::Rc,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use crate::tls::{peer_role, Role};
use bytes::BytesMut;
use pagestore_engine::{event::Event, DmaBuffer, PageData};
use pagestore_protocol::frame::{Preamble, PREAMBLE_LEN};
use quinn_proto::{
    ConnectionHandle, DatagramEvent, Dir, Event as QEvent, Incoming, ReadError, ServerConfig,
    StreamEvent, StreamId, VarInt, WriteError,
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
    fn len(&self) -> usize {
        match self {
            Body::Empty => 0,
            Body::Bytes(b) => b.len(),
            Body::Page(p) => p.len(),
            Body::Shared(b) => b.len(),
        }
    }

    /// The body as `Bytes` for quinn-proto's `write_chunks`, without copying: an owned vector is
    /// taken over, a cached page stays in the buffer its disk read filled (see [`ShardLocal`]).
    pub fn into_bytes(self) -> bytes::Bytes {
        match self {
            Body::Empty => bytes::Bytes::new(),
            Body::Bytes(b) => b.into(),
            Body::Page(p) => bytes::Bytes::from_owner(ShardLocal::new(p)),
            Body::Shared(b) => b,
        }
    }
}

/// A cached page handed to quinn-proto as `Bytes` (which wants a `Send` owner) while it stays on
/// the shard's thread: the page lives in a glommio DMA buffer, reference-counted with `Rc` and
/// owned by this executor, so it must be released here.
///
/// Only the endpoint's connections hold these `Bytes`: quinn-proto keeps stream data until the
/// peer acknowledges it, then drops it, and copies it into packets (`poll_transmit`) without
/// handing the `Bytes` on. The endpoint and its connections never leave the shard's thread (the
/// endpoint holds `Rc`s, so it is not `Send` itself). The thread is checked anyway: a release on
/// another thread aborts the process rather than touch the `Rc` from there.
struct ShardLocal {
    page: std::mem::ManuallyDrop<PageData>,
    thread: std::thread::ThreadId,
}

impl ShardLocal {
    fn new(page: PageData) -> ShardLocal {
        ShardLocal {
            page: std::mem::ManuallyDrop::new(page),
            thread: std::thread::current().id(),
        }
    }
}

// SAFETY: a `ShardLocal` only moves into `Bytes` owned by the endpoint's quinn-proto connections,
// which live and are dropped on the shard's thread (see the type's documentation). Reading the
// bytes from another thread would be sound (the buffer is immutable and outlives the `Rc`), and
// releasing them there is refused by `Drop`, which aborts instead of touching the `Rc`.
unsafe impl Send for ShardLocal {}

impl AsRef<[u8]> for ShardLocal {
    fn as_ref(&self) -> &[u8] {
        &self.page
    }
}

impl Drop for ShardLocal {
    fn drop(&mut self) {
        if std::thread::current().id() != self.thread {
            // Unreachable by construction; continuing would race the shard on the `Rc`'s count.
            tracing::error!("a cached page's buffer was released off its shard's thread");
            std::process::abort();
        }
        // SAFETY: dropped exactly once, here, on the thread that owns it.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.page) }
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

/// One request as the endpoint received it (everything the client wrote on the stream).
pub struct Received {
    /// The frame: preamble, header and payload; only the first two where the payload came
    /// `apart`.
    pub frame: Vec<u8>,
    /// The payload, received into a buffer the service gave for it
    /// ([`Service::payload_buffer`]), and how many payload bytes arrived: not the buffer's
    /// length, and more than it holds when the peer sent more than its frame announced (those
    /// bytes are dropped; the frame is malformed).
    pub apart: Option<(DmaBuffer, usize)>,
}

/// What a shard does with one request. Runs on the shard's executor.
pub trait Service: 'static {
    /// Answers one complete request from `peer`.
    fn call(self: Rc<Self>, request: Received, peer: Peer) -> Pin<Box<dyn Future<Output = Reply>>>;

    /// The most bytes (frame head and body) the reply to `request` can hold: reserved from the
    /// node's reply budget before the request is served (see
    /// [`EndpointOptions::reply_budget`]). A reply that turns out larger is charged in full
    /// once it is ready.
    fn reply_bound(&self, request: &Received) -> usize;

    /// A buffer to receive a payload of `len` bytes into, instead of after the frame's head in
    /// the request buffer: a page to be written goes straight into memory aligned for the
    /// disk, so the shard writes it without copying it again. Asked only for payloads of
    /// [`APART_MIN`] bytes or more, once the frame's head has arrived and the request is
    /// charged for the buffer (`len` rounded up to 4096). `None` (the default): after the
    /// head. The buffer must hold at least `len` bytes.
    fn payload_buffer(&self, len: usize) -> Option<DmaBuffer> {
        let _ = len;
        None
    }
}

/// Payloads shorter than this always follow their frame's head in the request buffer: a
/// separate buffer saves the copy of a large page, not of a small one.
pub const APART_MIN: usize = 64 << 10;

/// Settings of one endpoint.
#[derive(Clone)]
pub struct EndpointOptions {
    /// Address to bind (one per shard: base port + shard index).
    pub addr: SocketAddr,
    /// TLS settings for accepted connections. Its transport settings are replaced by
    /// [`crate::transport::server_transport_config`]: the memory bounds below rely on the
    /// receive windows set there.
    pub server: Arc<ServerConfig>,
    /// Largest request accepted (frame head and payload); a larger one resets the stream.
    pub max_request: usize,
    /// Request bytes one connection may make the shard hold from the node's budget (partly
    /// received requests and requests being served); at least `max_request`. Beyond it the
    /// connection's streams wait unread and QUIC flow control holds the client back.
    pub max_buffered: usize,
    /// Connection, handshake and stall limits.
    pub limits: Limits,
    /// The node-wide budget of request bytes, shared by the node's shards.
    pub budget: Arc<RequestBudget>,
    /// The node-wide budget of reply bytes (requests being served, and replies until the peer
    /// has acknowledged them), shared by the node's shards. Separate from `budget`, so that a
    /// received request waiting for room for its reply never holds up the replies it waits on.
    pub reply_budget: Arc<RequestBudget>,
}

/// What one peer may make an endpoint hold, and for how long (see docs/SECURITY.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Request bytes the whole node may hold in partly received requests and requests being
    /// served (the [`RequestBudget`]); at least the largest request.
    pub max_partial_bytes: usize,
    /// Connections one shard endpoint accepts at once; more are refused (CONNECTION_REFUSED).
    pub max_connections: usize,
    /// Connections one shard endpoint accepts from one IP address at once.
    pub max_connections_per_ip: usize,
    /// A request whose bytes stop arriving for this long is reset and its buffer freed.
    pub request_stall_timeout: Duration,
    /// Handshakes one shard endpoint runs at once; beyond it, new attempts from unvalidated
    /// addresses get a Retry and validated ones are refused.
    pub max_handshakes: usize,
    /// New connections per second on one shard above which attempts from addresses not yet
    /// validated get a stateless Retry first. 0: always Retry; `u32::MAX`: never.
    pub retry_rate: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_partial_bytes: 256 << 20,
            max_connections: 1024,
            max_connections_per_ip: 128,
            request_stall_timeout: Duration::from_secs(10),
            max_handshakes: 256,
            retry_rate: 128,
        }
    }
}

/// Bytes of requests held by a node's endpoints (partly received, or complete and being served),
/// shared by its shards. Touched when a request's buffer grows (doubling, so a few times per
/// request) and when the request ends; never per datagram.
#[derive(Debug)]
pub struct RequestBudget {
    limit: usize,
    used: AtomicUsize,
    /// Times a reservation found the budget spent: shards compare it between their scans to
    /// learn that someone is waiting.
    misses: AtomicU64,
}

impl RequestBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<RequestBudget> {
        Arc::new(RequestBudget {
            limit,
            used: AtomicUsize::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn try_take(&self, n: usize) -> bool {
        self.try_take_leaving(n, 0)
    }

    /// Takes `n` bytes if `keep` more would still be left.
    fn try_take_leaving(&self, n: usize, keep: usize) -> bool {
        let ok = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
                u.checked_add(n)
                    .filter(|&t| t.saturating_add(keep) <= self.limit)
            })
            .is_ok();
        if !ok {
            self.misses.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }

    fn take_anyway(&self, n: usize) {
        self.used.fetch_add(n, Ordering::AcqRel);
    }

    fn give(&self, n: usize) {
        if n > 0 {
            self.used.fetch_sub(n, Ordering::AcqRel);
        }
    }
}

/// Bytes of request buffers one connection may hold without drawing on the node's budget, so
/// that small requests (every read) are served even while large ones wait for budget.
pub const CONNECTION_ALLOWANCE: usize = 64 << 10;
/// The smallest request buffer; buffers then double (by at most 1 MiB at a time) as bytes
/// arrive.
const MIN_BUFFER: usize = 1024;
/// Reply bytes one connection may hold, in multiples of its request share (`max_buffered`):
/// requests are small and replies large, so a connection keeps more replies than requests in
/// flight.
const REPLY_SHARE: usize = 4;
/// No connection holds more than this fraction of the node's reply budget (beyond one reply),
/// so it takes at least this many connections that do not read their replies to fill it.
const REPLY_SHARE_OF_BUDGET: usize = 8;
/// While requests wait for the node's reply budget, a reply that has made no progress (bytes
/// taken by flow control, or acknowledged) for this long is reset, with the requests its
/// connection has queued, instead of after the full stall timeout: a peer that does not read
/// its replies must not keep the budget from those that do.
const PRESSURE_STALL: Duration = Duration::from_secs(1);
/// Freed request and reply bytes after which the shard asks the allocator to return memory to the system.
const TRIM_AFTER: usize = 16 << 20;

/// Bytes for one received datagram or GRO batch: the kernel merges UDP segments up to 64 KiB.
const RECV_SLOT: usize = 64 << 10;

/// Receive calls (each up to `quinn_udp::BATCH_SIZE` datagrams or GRO batches) per driver turn
/// before the connections are driven again.
const RECV_CALLS_PER_TURN: usize = 4;

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
    /// Connection attempts refused (connection or handshake limits).
    pub refused: Cell<u64>,
    /// Retry packets sent (address validation).
    pub retries: Cell<u64>,
    /// Requests reset because their bytes stopped arriving.
    pub stalled: Cell<u64>,
    /// Times a request had to wait for the node's request budget.
    pub budget_waits: Cell<u64>,
    /// Requests whose payload was received into a buffer of the service's
    /// ([`Service::payload_buffer`]) instead of the request buffer.
    pub payloads_apart: Cell<u64>,
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
    Reading(Partial),
    /// Received in full; waits for room for its reply (the connection's share, or the node's
    /// reply budget). `waiting`: counted as a wait for the node's budget already. `bound`: its
    /// [`Service::reply_bound`], worked out once (0: not yet).
    Queued {
        request: Received,
        charge: Charge,
        waiting: bool,
        bound: usize,
    },
    /// With the service; the task holds the request's charges.
    Serving,
    /// Being written into quinn-proto as flow control allows: the frame head, then the body,
    /// handed over as `Bytes` (no copy); each is advanced as quinn-proto takes it. `last`: when
    /// bytes last went.
    Writing {
        chunks: [bytes::Bytes; 2],
        charge: ReplyCharge,
        last: Instant,
    },
    /// Written in full and finished: quinn-proto holds the bytes until the peer acknowledges
    /// them, and the charge stays until then (`StreamEvent::Finished`).
    Sent {
        /// Held for its `Drop`, which gives the bytes back.
        _charge: ReplyCharge,
        last: Instant,
    },
}

/// Request bytes one connection holds (buffer capacity), by where they were charged, and the
/// reply bytes it holds.
struct ConnCharge {
    /// From the connection's own [`CONNECTION_ALLOWANCE`].
    own: Cell<usize>,
    /// From the node's [`RequestBudget`].
    node: Cell<usize>,
    /// Bytes that arrived into those buffers (always at most `own + node`).
    filled: Cell<usize>,
    /// Reply bytes, from the node's reply budget: what requests being served reserved, then
    /// each reply's size until the peer has acknowledged it.
    replies: Cell<usize>,
}

thread_local! {
    /// Request buffer and reply bytes freed on this shard since the allocator was last asked to trim.
    static FREED: Cell<usize> = const { Cell::new(0) };
    /// Large request buffers kept for reuse on this shard, and their capacity in all.
    static SPARE: RefCell<(Vec<Vec<u8>>, usize)> = const { RefCell::new((Vec::new(), 0)) };
    /// Whether a buffer was kept or taken on this shard since the last [`release_idle_spares`].
    static SPARE_USED: Cell<bool> = const { Cell::new(false) };
}

/// Request buffers of at least this capacity are kept for reuse once served: a written page
/// (4 MiB) would otherwise be received into freshly mapped memory, faulted in page by page.
const REUSE_MIN: usize = 256 << 10;
/// The most bytes of request buffers one shard keeps for reuse. Kept buffers are not charged
/// to any peer; this bounds them.
const REUSE_MAX: usize = 16 << 20;

/// A kept request buffer (empty) of at least `capacity` bytes, if this shard has one.
fn spare_buffer(capacity: usize) -> Option<Vec<u8>> {
    SPARE.with(|s| {
        let mut s = s.borrow_mut();
        let i = s.0.iter().position(|b| b.capacity() >= capacity)?;
        let b = s.0.swap_remove(i);
        s.1 -= b.capacity();
        SPARE_USED.with(|u| u.set(true));
        Some(b)
    })
}

/// Frees the kept buffers when none was kept or taken since the last call (the shard calls
/// this once a second): they serve a stream of writes, and a shard whose writers have stopped
/// gives their memory back within two seconds. Returns the bytes freed.
fn release_idle_spares() -> usize {
    if SPARE_USED.with(|u| u.replace(false)) {
        return 0;
    }
    SPARE.with(|s| {
        let mut s = s.borrow_mut();
        s.0.clear();
        s.0.shrink_to_fit();
        std::mem::take(&mut s.1)
    })
}

/// Keeps a served request's buffer for a later request on this shard when it is large and the
/// shard keeps under [`REUSE_MAX`] bytes; frees it otherwise.
pub(crate) fn recycle_request_buffer(mut buf: Vec<u8>) {
    let cap = buf.capacity();
    if cap < REUSE_MIN {
        return;
    }
    buf.clear();
    SPARE.with(|s| {
        let mut s = s.borrow_mut();
        if s.1 + cap <= REUSE_MAX {
            s.1 += cap;
            s.0.push(buf);
            SPARE_USED.with(|u| u.set(true));
        }
    });
}

/// The bytes one request's buffer is charged; given back when dropped (the request was reset,
/// its connection closed, or its reply is ready).
struct Charge {
    own: usize,
    node: usize,
    /// Bytes that arrived.
    filled: usize,
    conn: Rc<ConnCharge>,
    budget: Arc<RequestBudget>,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.conn.own.set(self.conn.own.get() - self.own);
        self.conn.node.set(self.conn.node.get() - self.node);
        self.conn.filled.set(self.conn.filled.get() - self.filled);
        self.budget.give(self.node);
        FREED.with(|f| f.set(f.get().saturating_add(self.own + self.node)));
    }
}

/// Reply bytes held for one request: reserved by the service for a reply with data, set to the
/// reply's size when that is ready, given back when the peer has acknowledged the reply (or
/// the stream or connection ends).
struct ReplyCharge {
    bytes: usize,
    conn: Rc<ConnCharge>,
    budget: Arc<RequestBudget>,
}

impl ReplyCharge {
    /// Reserves `n` bytes for a reply on connection `conn`, within its share `conn_max` (a
    /// connection that holds nothing may take more). The budget's last `n` bytes go only to
    /// connections that hold no reply bytes, so a reader that is owed nothing is served at
    /// once even while others fill the budget.
    /// `Err(true)`: the node's reply budget is spent; `Err(false)`: the connection's share is.
    fn reserve(
        conn: &Rc<ConnCharge>,
        budget: &Arc<RequestBudget>,
        n: usize,
        conn_max: usize,
    ) -> Result<ReplyCharge, bool> {
        let held = conn.replies.get();
        if held > 0 && held + n > conn_max {
            return Err(false);
        }
        let keep = if held == 0 { 0 } else { n };
        if !budget.try_take_leaving(n, keep) {
            return Err(true);
        }
        conn.replies.set(held + n);
        Ok(ReplyCharge {
            bytes: n,
            conn: conn.clone(),
            budget: budget.clone(),
        })
    }

    /// Charges the reply's actual size instead of the reservation. What was not reserved is
    /// taken even past the limit: the bytes exist already, and the next reservations wait
    /// until the budget is back under it.
    fn settle(&mut self, n: usize) {
        if n < self.bytes {
            self.budget.give(self.bytes - n);
        } else {
            self.budget.take_anyway(n - self.bytes);
        }
        self.conn
            .replies
            .set(self.conn.replies.get() - self.bytes + n);
        self.bytes = n;
    }
}

impl Drop for ReplyCharge {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        self.conn.replies.set(self.conn.replies.get() - self.bytes);
        self.budget.give(self.bytes);
        FREED.with(|f| f.set(f.get().saturating_add(self.bytes)));
    }
}

/// A request being received. Its buffer grows with what arrived, never from a length the peer
/// claims, and only within what was charged for it beforehand.
struct Partial {
    /// The frame's bytes; only its head where the payload goes `apart`.
    buf: Vec<u8>,
    /// Where the payload goes.
    payload: PayloadPlace,
    charge: Charge,
    /// When bytes last arrived, or when the request last stopped waiting for budget.
    last: Instant,
    /// Waiting for the node's budget (not the peer's fault: no stall timeout meanwhile).
    waiting: bool,
}

/// Where a request's payload is received.
enum PayloadPlace {
    /// Not decided: the frame's head is arriving, and no byte past its first `.0` bytes (the
    /// preamble until that is read, then the whole head) is taken before it is.
    Head(usize),
    /// After the head, in the request buffer.
    InBuffer,
    /// Into a buffer of its own from the service ([`Service::payload_buffer`]); `arrived`
    /// payload bytes came, of which those past the buffer's end were dropped.
    Apart { buf: DmaBuffer, arrived: usize },
}

impl Partial {
    fn new(charge: Charge, now: Instant) -> Partial {
        Partial {
            buf: Vec::new(),
            payload: PayloadPlace::Head(PREAMBLE_LEN),
            charge,
            last: now,
            waiting: false,
        }
    }

    fn held(&self) -> usize {
        self.charge.own + self.charge.node
    }

    /// Bytes of the request that arrived.
    fn received(&self) -> usize {
        match &self.payload {
            PayloadPlace::Apart { arrived, .. } => self.buf.len() + arrived,
            _ => self.buf.len(),
        }
    }

    /// Decides where the payload goes once the bytes the head needs have arrived: apart, in a
    /// buffer from `service`, when it is large, the preamble is valid and the request can be
    /// charged for that buffer within `max`; after the head otherwise (a malformed preamble
    /// included: the service answers it). Waits, like [`Partial::charge_more`] (whose `Err` it
    /// returns), while the charge cannot cover the buffer.
    fn place_payload(
        &mut self,
        max: usize,
        conn_max: usize,
        service: &dyn Service,
        stats: &EndpointStats,
    ) -> Result<(), bool> {
        let PayloadPlace::Head(wanted) = self.payload else {
            return Ok(());
        };
        if self.buf.len() < wanted {
            return Ok(());
        }
        let Ok(preamble) = Preamble::decode_prefix(&self.buf) else {
            self.payload = PayloadPlace::InBuffer;
            return Ok(());
        };
        let head = preamble.payload_range().start;
        if self.buf.len() < head {
            self.payload = PayloadPlace::Head(head);
            return Ok(());
        }
        let len = preamble.payload_len as usize;
        let needed = self.buf.capacity().max(head) + len.next_multiple_of(4096);
        // (Bytes past the head are never taken before this point; were any, the payload
        // would have begun in the request buffer.)
        if len < APART_MIN || needed > max || self.buf.len() > head {
            self.payload = PayloadPlace::InBuffer;
            return Ok(());
        }
        while self.held() < needed {
            self.charge_more(max, conn_max)?;
        }
        self.payload = match service.payload_buffer(len) {
            Some(buf) if buf.len() >= len => {
                stats.payloads_apart.set(stats.payloads_apart.get() + 1);
                PayloadPlace::Apart { buf, arrived: 0 }
            }
            _ => PayloadPlace::InBuffer,
        };
        Ok(())
    }

    /// Keeps bytes that arrived.
    fn take(&mut self, bytes: &[u8]) {
        match &mut self.payload {
            PayloadPlace::Apart { buf, arrived } => {
                let dst = buf.as_bytes_mut();
                let start = (*arrived).min(dst.len());
                let end = (*arrived + bytes.len()).min(dst.len());
                dst[start..end].copy_from_slice(&bytes[..end - start]);
                *arrived += bytes.len();
            }
            _ => self.buf.extend_from_slice(bytes),
        }
    }

    /// The request as received, once the peer has finished it.
    fn into_received(self) -> (Received, Charge) {
        let apart = match self.payload {
            PayloadPlace::Apart { buf, arrived } => Some((buf, arrived)),
            _ => None,
        };
        let request = Received {
            frame: self.buf,
            apart,
        };
        (request, self.charge)
    }

    /// Charges more bytes to this request. While it is small, its charge doubles within the
    /// connection's allowance; past that it takes the rest of a whole request (`max`) from the
    /// node's budget at once, within the connection's share `conn_max`, so that a request that
    /// got budget can always be received to its end (no request holds part of the budget while
    /// waiting for more). `Err(true)`: the node's budget is spent; `Err(false)`: the
    /// connection's share is.
    fn charge_more(&mut self, max: usize, conn_max: usize) -> Result<(), bool> {
        let held = self.held();
        let c = &self.charge;
        let small = (held * 2).max(MIN_BUFFER).min(max) - held;
        if c.node == 0 && small > 0 && c.conn.own.get() + small <= CONNECTION_ALLOWANCE {
            c.conn.own.set(c.conn.own.get() + small);
            self.charge.own += small;
            return Ok(());
        }
        let rest = max.saturating_sub(held);
        if rest == 0 {
            return Err(false);
        }
        if c.conn.node.get() + rest > conn_max {
            return Err(false);
        }
        if !c.budget.try_take(rest) {
            return Err(true);
        }
        c.conn.node.set(c.conn.node.get() + rest);
        self.charge.node += rest;
        Ok(())
    }

    /// Grows the buffer within the charge: doubling, by at most 1 MiB at a time, so memory
    /// follows the bytes that arrived, not the charge.
    ///
    /// A large request takes a kept buffer ([`recycle_request_buffer`]) instead, when the shard
    /// has one: the bytes so far are copied into it once.
    fn grow_buffer(&mut self) {
        let len = self.buf.len();
        let target = (len * 2)
            .max(MIN_BUFFER)
            .min(len + (1 << 20))
            .min(self.held());
        if target >= REUSE_MIN {
            if let Some(mut b) = spare_buffer(target) {
                b.extend_from_slice(&self.buf);
                self.buf = b;
                return;
            }
        }
        self.buf.reserve_exact(target.saturating_sub(len));
    }
}

struct Conn {
    conn: quinn_proto::Connection,
    /// The peer, once its handshake is complete (streams only open after it).
    peer: Option<Peer>,
    streams: HashMap<StreamId, StreamState>,
    /// Request bytes charged to this connection; its QUIC receive window is
    /// [`crate::transport::SERVER_BASE_WINDOW`] plus the charged room not yet filled, so what
    /// the peer has sent and the shard not yet answered never exceeds the base window plus the
    /// charges (quinn-proto's unread bytes included).
    charge: Rc<ConnCharge>,
    /// The receive window last given to quinn-proto.
    window: usize,
    /// Streams waiting for request budget; retried on later turns.
    starved: Vec<StreamId>,
}

type Done = Rc<RefCell<VecDeque<(ConnectionHandle, StreamId, Reply, ReplyCharge)>>>;

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
    limits: Limits,
    budget: Arc<RequestBudget>,
    reply_budget: Arc<RequestBudget>,
    /// The reply budget's misses at the last scan for stalled requests.
    reply_misses: u64,
    /// Connections by source IP address (as first seen; migration does not move them).
    per_ip: HashMap<IpAddr, usize>,
    conn_ip: HashMap<ConnectionHandle, IpAddr>,
    /// Connections still in their handshake.
    handshaking: HashSet<ConnectionHandle>,
    /// Connections accepted in the current one-second window, and when it began.
    rate: (Instant, u32),
    /// Next scan for stalled requests.
    next_scan: Instant,
    /// Some stream waits for budget another shard may free: poll for it.
    starving: bool,
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
    let mut server = (*options.server).clone();
    server.transport_config(crate::transport::server_transport_config());
    // Incoming attempts are decided on at once (accept, retry or refuse), so a few suffice.
    server.max_incoming(64);
    let endpoint = quinn_proto::Endpoint::new(
        Arc::new(crate::transport::endpoint_config()),
        Some(Arc::new(server)),
        true,
        None,
    );
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
        limits: options.limits,
        budget: options.budget,
        reply_budget: options.reply_budget,
        reply_misses: 0,
        per_ip: HashMap::new(),
        conn_ip: HashMap::new(),
        handshaking: HashSet::new(),
        rate: (Instant::now(), 0),
        next_scan: Instant::now() + Duration::from_secs(1),
        starving: false,
        recv_buf: vec![0u8; RECV_SLOT * quinn_udp::BATCH_SIZE],
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
            if now >= self.next_scan {
                self.next_scan = now + Duration::from_secs(1);
                self.reset_stalled(now);
                trim_if_freed(release_idle_spares() > 0);
            }
            let mut work = self.receive(now)?;
            work |= self.take_replies();
            self.starving = false;
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
            // Budget freed on another shard wakes nobody here: poll for it while starving.
            let starving = self.starving.then(|| now + Duration::from_millis(10));
            let scan = (!self.conns.is_empty()).then_some(self.next_scan);
            let deadline = self
                .conns
                .values_mut()
                .filter_map(|c| c.conn.poll_timeout())
                .chain(close_at.values().copied())
                .chain(starving)
                .chain(scan)
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

    /// Reads the datagrams waiting on the socket, in batches (`recvmmsg`, each slot a GRO batch
    /// of up to 64 KiB), at most [`RECV_CALLS_PER_TURN`] calls: the turn then drives every
    /// connection before it reads more, so one busy peer cannot hold the shard in its receive
    /// loop. Each batch is copied once into `Bytes` that quinn-proto's datagrams are split from.
    fn receive(&mut self, now: Instant) -> io::Result<bool> {
        let mut any = false;
        for _ in 0..RECV_CALLS_PER_TURN {
            let mut meta = [quinn_udp::RecvMeta::default(); quinn_udp::BATCH_SIZE];
            let n = {
                let mut slots = self.recv_buf.chunks_mut(RECV_SLOT);
                let mut bufs: [IoSliceMut<'_>; quinn_udp::BATCH_SIZE] =
                    std::array::from_fn(|_| IoSliceMut::new(slots.next().unwrap_or_default()));
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
            for (i, m) in meta[..n].iter().enumerate() {
                let slot = i * RECV_SLOT;
                let len = m.len.min(RECV_SLOT);
                let stride = m.stride.max(1);
                let mut batch = BytesMut::from(&self.recv_buf[slot..slot + len]);
                while !batch.is_empty() {
                    let data = batch.split_to(stride.min(batch.len()));
                    self.stats
                        .datagrams_in
                        .set(self.stats.datagrams_in.get() + 1);
                    self.handle_datagram(now, m.addr, m.dst_ip, m.ecn, data);
                }
            }
        }
        Ok(any)
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
            Some(DatagramEvent::NewConnection(incoming)) => self.admit(now, incoming, &mut buf),
            Some(DatagramEvent::ConnectionEvent(ch, ev)) => {
                if let Some(c) = self.conns.get_mut(&ch) {
                    c.conn.handle_event(ev);
                }
            }
            Some(DatagramEvent::Response(t)) => self.out.send(&t, &buf),
            None => {}
        }
    }

    /// Decides on a connection attempt: refused over the connection limits, answered with a
    /// Retry (no state kept) when handshakes come fast or many are in progress and the address
    /// is not validated yet, else accepted.
    fn admit(&mut self, now: Instant, incoming: Incoming, buf: &mut Vec<u8>) {
        let ip = incoming.remote_address().ip().to_canonical();
        let l = &self.limits;
        let from_ip = self.per_ip.get(&ip).copied().unwrap_or(0);
        if self.conns.len() >= l.max_connections || from_ip >= l.max_connections_per_ip {
            tracing::debug!(%ip, from_ip, total = self.conns.len(), "connection refused: limit");
            return self.refuse(incoming, buf);
        }
        if now.duration_since(self.rate.0) >= Duration::from_secs(1) {
            self.rate = (now, 0);
        }
        let busy = self.rate.1 >= l.retry_rate || self.handshaking.len() >= l.max_handshakes;
        if busy && !incoming.remote_address_validated() {
            match self.endpoint.retry(incoming, buf) {
                Ok(t) => {
                    self.stats.retries.set(self.stats.retries.get() + 1);
                    self.out.send(&t, buf);
                }
                // Not reachable (an unvalidated attempt may always be retried); refuse anyway.
                Err(e) => self.refuse(e.into_incoming(), buf),
            }
            return;
        }
        if self.handshaking.len() >= l.max_handshakes {
            return self.refuse(incoming, buf);
        }
        match self.endpoint.accept(incoming, now, buf, None) {
            Ok((ch, conn)) => {
                self.stats.connections.set(self.stats.connections.get() + 1);
                self.rate.1 = self.rate.1.saturating_add(1);
                *self.per_ip.entry(ip).or_insert(0) += 1;
                self.conn_ip.insert(ch, ip);
                self.handshaking.insert(ch);
                self.conns.insert(
                    ch,
                    Conn {
                        conn,
                        peer: None,
                        streams: HashMap::new(),
                        charge: Rc::new(ConnCharge {
                            own: Cell::new(0),
                            node: Cell::new(0),
                            filled: Cell::new(0),
                            replies: Cell::new(0),
                        }),
                        window: crate::transport::SERVER_BASE_WINDOW as usize,
                        starved: Vec::new(),
                    },
                );
            }
            Err(e) => {
                if let Some(t) = e.response {
                    self.out.send(&t, buf);
                }
            }
        }
    }

    fn refuse(&mut self, incoming: Incoming, buf: &mut Vec<u8>) {
        self.stats.refused.set(self.stats.refused.get() + 1);
        let t = self.endpoint.refuse(incoming, buf);
        self.out.send(&t, buf);
    }

    /// Resets every request whose bytes stopped arriving for the stall timeout (not those
    /// waiting for the node's budget: that wait is not the peer's doing), and every reply the
    /// peer stopped taking for as long; for [`PRESSURE_STALL`] only while others wait for the
    /// reply budget.
    fn reset_stalled(&mut self, now: Instant) {
        let timeout = self.limits.request_stall_timeout;
        let misses = self.reply_budget.misses();
        let pressure = misses != self.reply_misses;
        self.reply_misses = misses;
        let reply_timeout = if pressure {
            timeout.min(PRESSURE_STALL)
        } else {
            timeout
        };
        for c in self.conns.values_mut() {
            // While one request waits for budget, the peer's later requests may be held back by
            // the connection's flow control: those that hold no budget yet wait with it.
            let blocked = c
                .streams
                .values()
                .any(|s| matches!(s, StreamState::Reading(p) if p.waiting));
            let stuck_reply = |s: &StreamState| match s {
                StreamState::Writing { last, .. } | StreamState::Sent { last, .. } => {
                    now.duration_since(*last) >= reply_timeout
                }
                _ => false,
            };
            // A connection that stopped taking its replies will not take those it queued.
            let not_reading = c.streams.values().any(stuck_reply);
            let stalled: Vec<StreamId> = c
                .streams
                .iter()
                .filter_map(|(id, s)| match s {
                    StreamState::Reading(p)
                        if !(p.waiting || blocked && p.charge.node == 0)
                            && now.duration_since(p.last) >= timeout =>
                    {
                        Some(*id)
                    }
                    StreamState::Queued { .. } if not_reading => Some(*id),
                    s if stuck_reply(s) => Some(*id),
                    _ => None,
                })
                .collect();
            for id in stalled {
                self.stats.stalled.set(self.stats.stalled.get() + 1);
                let _ = c.conn.recv_stream(id).stop(VarInt::from_u32(2));
                let _ = c.conn.send_stream(id).reset(VarInt::from_u32(2));
                c.streams.remove(&id);
                c.starved.retain(|s| *s != id);
            }
        }
    }

    /// Moves finished replies from the service tasks onto their streams.
    fn take_replies(&mut self) -> bool {
        let mut any = false;
        let now = Instant::now();
        loop {
            let next = self.done.borrow_mut().pop_front();
            let Some((ch, id, reply, charge)) = next else {
                return any;
            };
            any = true;
            if let Some(c) = self.conns.get_mut(&ch) {
                if let Some(s) = c.streams.get_mut(&id) {
                    *s = StreamState::Writing {
                        chunks: [reply.head.into(), reply.body.into_bytes()],
                        charge,
                        last: now,
                    };
                    write_stream(c, id, now);
                }
            }
        }
    }

    /// Runs one connection: timers, events, new streams, reads, writes, transmits.
    // Long because: one pass over a connection in quinn-proto's required order (timeouts,
    // endpoint events, stream events, reads, writes, transmits); each phase is a short block.
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
        if !self.handshaking.is_empty() && !c.conn.is_handshaking() {
            self.handshaking.remove(&ch);
        }
        let mut readable = Vec::new();
        while let Some(ev) = c.conn.poll() {
            work = true;
            match ev {
                QEvent::Stream(StreamEvent::Readable { id }) => readable.push(id),
                QEvent::Stream(StreamEvent::Writable { id }) => write_stream(c, id, now),
                // The peer stopped reading, or acknowledged the whole reply: its bytes are gone.
                QEvent::Stream(StreamEvent::Stopped { id, .. } | StreamEvent::Finished { id }) => {
                    c.streams.remove(&id);
                }
                _ => {}
            }
        }
        while let Some(id) = c.conn.streams().accept(Dir::Bi) {
            let charge = Charge {
                own: 0,
                node: 0,
                filled: 0,
                conn: c.charge.clone(),
                budget: self.budget.clone(),
            };
            let partial = Partial::new(charge, now);
            c.streams.insert(id, StreamState::Reading(partial));
            readable.push(id);
            work = true;
        }
        if !c.starved.is_empty() {
            readable.append(&mut c.starved);
        }
        let limits = ReadLimits {
            max_request: self.max_request,
            max_buffered: self.max_buffered,
        };
        for id in readable {
            if matches!(c.streams.get(&id), Some(StreamState::Reading(_))) {
                read_stream(c, id, &*self.service, &limits, now, &self.stats);
            }
            let Some((request, charge, reply_charge)) = take_queued(
                c,
                id,
                &*self.service,
                &self.reply_budget,
                &limits,
                &self.stats,
            ) else {
                continue;
            };
            {
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
                    // The request's bytes count against the budget until its reply is ready.
                    drop(charge);
                    let mut reply_charge = reply_charge;
                    reply_charge.settle(reply.head.len() + reply.body.len());
                    done.borrow_mut().push_back((ch, id, reply, reply_charge));
                    wake.notify_all();
                })
                .detach();
            }
        }
        self.starving |= !c.starved.is_empty();
        // The peer may have the base window unread, plus what the requests charged to this
        // connection still have room for: the shard never holds more for it than the base
        // window and its charges.
        let window = crate::transport::SERVER_BASE_WINDOW as usize
            + (c.charge.own.get() + c.charge.node.get()).saturating_sub(c.charge.filled.get());
        if window != c.window {
            c.window = window;
            c.conn
                .set_receive_window(VarInt::from_u64(window as u64).unwrap_or(VarInt::MAX));
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
            self.handshaking.remove(&ch);
            if let Some(ip) = self.conn_ip.remove(&ch) {
                if let Some(n) = self.per_ip.get_mut(&ip) {
                    *n -= 1;
                    if *n == 0 {
                        self.per_ip.remove(&ip);
                    }
                }
            }
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

/// Asks glibc to give freed memory back to the system once enough request buffers were freed
/// on this shard since the last time, or `now` (kept buffers were just freed): large buffers
/// come from the shard's arena, and glibc keeps a freed arena's top and holes mapped, so
/// without this the RSS an attacker raised would not come down after the connections leave.
fn trim_if_freed(now: bool) {
    let freed = FREED.with(|f| f.get());
    if freed < TRIM_AFTER && !now {
        return;
    }
    FREED.with(|f| f.set(0));
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the system; it takes the allocator's
    // own locks and touches no memory that is in use.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Size limits for reading requests.
struct ReadLimits {
    max_request: usize,
    max_buffered: usize,
}

/// Takes a received request (`Queued`) for the service once there is room for its reply (its
/// [`Service::reply_bound`], at most the whole budget) in the node's reply budget, within the
/// connection's share ([`REPLY_SHARE`], [`REPLY_SHARE_OF_BUDGET`]). Without room it stays queued in `c.starved` (its peer has sent
/// everything; no stall clock runs) and the connection's later requests wait unread behind
/// flow control.
fn take_queued(
    c: &mut Conn,
    id: StreamId,
    service: &dyn Service,
    budget: &Arc<RequestBudget>,
    limits: &ReadLimits,
    stats: &EndpointStats,
) -> Option<(Received, Charge, ReplyCharge)> {
    let Some(StreamState::Queued {
        request,
        waiting,
        bound,
        ..
    }) = c.streams.get_mut(&id)
    else {
        return None;
    };
    // Retried on every turn while it waits: decode the request once.
    if *bound == 0 {
        *bound = service.reply_bound(request).min(budget.limit()).max(1);
    }
    let bound = *bound;
    let share = limits
        .max_buffered
        .saturating_mul(REPLY_SHARE)
        .min(budget.limit() / REPLY_SHARE_OF_BUDGET);
    match ReplyCharge::reserve(&c.charge, budget, bound, share) {
        Ok(reply) => match c.streams.insert(id, StreamState::Serving) {
            Some(StreamState::Queued {
                request, charge, ..
            }) => Some((request, charge, reply)),
            _ => None,
        },
        Err(node) => {
            if node && !*waiting {
                stats.budget_waits.set(stats.budget_waits.get() + 1);
            }
            *waiting = node;
            if !c.starved.contains(&id) {
                c.starved.push(id);
            }
            None
        }
    }
}

/// Reads what has arrived on a request stream, as far as its charge allows (see
/// [`Partial::charge_more`]); a stream that cannot get more room waits in `c.starved`, its bytes left
/// in quinn-proto, where flow control holds the peer back. Once the client has finished its
/// side, the whole request is `Queued`, with the charge it keeps until its reply is ready.
// Long because: one stream's states (reading, starved, queued) and its charge are handled in
// one match so that every path settles the charge; splitting it would spread that invariant.
fn read_stream(
    c: &mut Conn,
    id: StreamId,
    service: &dyn Service,
    limits: &ReadLimits,
    now: Instant,
    stats: &EndpointStats,
) {
    let Some(StreamState::Reading(p)) = c.streams.get_mut(&id) else {
        return;
    };
    let max = limits.max_request;
    let mut fin = false;
    let mut fail = false;
    // Some(true): waiting for the node's budget; Some(false): over the connection's share.
    let mut starved = None;
    let mut got = false;
    {
        let mut recv = c.conn.recv_stream(id);
        let mut chunks = match recv.read(true) {
            Ok(ch) => ch,
            Err(_) => {
                c.streams.remove(&id);
                return;
            }
        };
        loop {
            if let Err(node) = p.place_payload(max, limits.max_buffered, service, stats) {
                starved = Some(node);
                break;
            }
            let room = p.held().min(p.buf.capacity()).saturating_sub(p.buf.len());
            let want = if let PayloadPlace::Apart { buf, arrived } = &p.payload {
                // Past the buffer's end, bytes are only counted (the frame is malformed).
                buf.len()
                    .checked_sub(*arrived)
                    .filter(|n| *n > 0)
                    .unwrap_or(usize::MAX)
            } else if room > 0 {
                match p.payload {
                    PayloadPlace::Head(wanted) => {
                        room.min(wanted.saturating_sub(p.buf.len()).max(1))
                    }
                    _ => room,
                }
            } else if p.buf.len() >= max {
                // Full size: any further byte makes the request too large.
                usize::MAX
            } else if p.buf.capacity() < p.held() {
                p.grow_buffer();
                continue;
            } else {
                match p.charge_more(max, limits.max_buffered) {
                    Ok(()) => continue,
                    Err(node) => {
                        starved = Some(node);
                        break;
                    }
                }
            };
            match chunks.next(want) {
                Ok(Some(chunk)) => {
                    if p.received() + chunk.bytes.len() > max {
                        fail = true;
                        break;
                    }
                    p.take(&chunk.bytes);
                    p.charge.filled += chunk.bytes.len();
                    p.charge
                        .conn
                        .filled
                        .set(p.charge.conn.filled.get() + chunk.bytes.len());
                    got = true;
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
    if fail {
        stats.rejected.set(stats.rejected.get() + 1);
        let _ = c.conn.recv_stream(id).stop(VarInt::from_u32(1));
        let _ = c.conn.send_stream(id).reset(VarInt::from_u32(1));
        c.streams.remove(&id);
        return;
    }
    if fin {
        if let Some(StreamState::Reading(p)) = c.streams.remove(&id) {
            let (request, charge) = p.into_received();
            let queued = StreamState::Queued {
                request,
                charge,
                waiting: false,
                bound: 0,
            };
            c.streams.insert(id, queued);
        }
        return;
    }
    if got || (p.waiting && starved != Some(true)) {
        // Bytes arrived, or the wait for budget is over: the stall clock starts afresh.
        p.last = now;
    }
    if let Some(node) = starved {
        if node && !p.waiting {
            stats.budget_waits.set(stats.budget_waits.get() + 1);
        }
        // Only a wait for the node's budget stops the stall clock: a connection over its own
        // share waits on its own requests, and the stall timeout frees it if they never end.
        p.waiting = node;
        if !c.starved.contains(&id) {
            c.starved.push(id);
        }
    } else {
        p.waiting = false;
    }
}

/// Writes as much of a reply as flow control allows; finishes the stream when all is written
/// and keeps its charge until the peer has acknowledged it.
fn write_stream(c: &mut Conn, id: StreamId, now: Instant) {
    let Some(StreamState::Writing { chunks, last, .. }) = c.streams.get_mut(&id) else {
        return;
    };
    let mut send = c.conn.send_stream(id);
    while let Some(first) = chunks.iter().position(|b| !b.is_empty()) {
        match send.write_chunks(&mut chunks[first..]) {
            Ok(w) if w.bytes > 0 => *last = now,
            Ok(_) | Err(WriteError::Blocked) => return,
            Err(_) => {
                c.streams.remove(&id);
                return;
            }
        }
    }
    let finished = send.finish().is_ok();
    match c.streams.remove(&id) {
        Some(StreamState::Writing { charge, .. }) if finished => {
            let sent = StreamState::Sent {
                _charge: charge,
                last: now,
            };
            c.streams.insert(id, sent);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept() -> usize {
        SPARE.with(|s| s.borrow().1)
    }

    #[test]
    fn large_request_buffers_are_kept_for_reuse_within_the_bound() {
        // Small buffers are freed.
        recycle_request_buffer(Vec::with_capacity(REUSE_MIN - 1));
        assert_eq!(kept(), 0);
        assert!(spare_buffer(1).is_none());
        // A large one is kept, emptied, and handed out once to a request that fits in it.
        let mut b = Vec::with_capacity(1 << 20);
        b.extend_from_slice(&[7; 1000]);
        recycle_request_buffer(b);
        assert!(kept() >= 1 << 20);
        assert!(
            spare_buffer(2 << 20).is_none(),
            "too small for that request"
        );
        let b = spare_buffer(REUSE_MIN).expect("the kept buffer");
        assert!(b.is_empty() && b.capacity() >= 1 << 20);
        assert_eq!(kept(), 0);
        assert!(spare_buffer(REUSE_MIN).is_none());
        // Never more than REUSE_MAX bytes kept.
        for _ in 0..40 {
            recycle_request_buffer(Vec::with_capacity(1 << 20));
        }
        assert!(
            kept() <= REUSE_MAX && kept() > REUSE_MAX - (1 << 20),
            "{}",
            kept()
        );
    }

    /// A request being received, charged `held` bytes from the node's budget, with `len` bytes
    /// of `fill` arrived.
    fn partial(held: usize, len: usize, fill: u8) -> Partial {
        let budget = RequestBudget::new(held);
        assert!(budget.try_take(held));
        let conn = Rc::new(ConnCharge {
            own: Cell::new(0),
            node: Cell::new(held),
            filled: Cell::new(len),
            replies: Cell::new(0),
        });
        let mut buf = Vec::with_capacity(len);
        buf.resize(len, fill);
        Partial {
            buf,
            payload: PayloadPlace::InBuffer,
            charge: Charge {
                own: 0,
                node: held,
                filled: len,
                conn,
                budget,
            },
            last: Instant::now(),
            waiting: false,
        }
    }

    #[test]
    fn a_growing_large_request_takes_a_kept_buffer_and_keeps_its_bytes() {
        const PAGE: usize = 4 << 20;
        // No kept buffer: the buffer grows by doubling, within the charge.
        let mut p = partial(PAGE, 128 << 10, 1);
        p.grow_buffer();
        assert!(p.buf.capacity() >= 256 << 10 && p.buf.capacity() < PAGE);
        // A served page's buffer kept: the next large request continues in it.
        recycle_request_buffer(Vec::with_capacity(PAGE + 4096));
        let mut p = partial(PAGE, 128 << 10, 2);
        p.grow_buffer();
        assert!(p.buf.capacity() >= PAGE, "{}", p.buf.capacity());
        assert!(p.buf.len() == 128 << 10 && p.buf.iter().all(|&b| b == 2));
        assert_eq!(kept(), 0);
        // A small request never takes one.
        recycle_request_buffer(Vec::with_capacity(PAGE));
        let mut p = partial(PAGE, 1000, 3);
        p.grow_buffer();
        assert!(p.buf.capacity() < REUSE_MIN);
        assert!(kept() >= PAGE);
    }

    #[test]
    fn kept_buffers_are_freed_once_a_second_passes_without_use() {
        recycle_request_buffer(Vec::with_capacity(1 << 20));
        // Kept in the second before: kept on.
        assert_eq!(release_idle_spares(), 0);
        assert!(kept() >= 1 << 20);
        // Taken and kept again within the next: kept on.
        let b = spare_buffer(REUSE_MIN).unwrap();
        recycle_request_buffer(b);
        assert_eq!(release_idle_spares(), 0);
        // A second without use: freed, and said how much.
        let held = kept();
        assert_eq!(release_idle_spares(), held);
        assert_eq!(kept(), 0);
        assert_eq!(release_idle_spares(), 0);
    }
}
