//! The page service a shard runs behind its QUIC endpoint: decodes request frames, checks ring
//! ownership, runs the request on the shard's engine (local API, same core) and encodes the reply.

use std::{
    cell::{Cell, RefCell},
    collections::{HashMap, HashSet},
    future::Future,
    ops::Range,
    pin::Pin,
    rc::Rc,
    sync::Arc,
};

use pagestore_engine::{DmaBuffer, EngineError, PageKey, Shard};

use crate::{
    endpoint::{Body, Peer, Received, Reply, Service},
    frame::{
        self, ErrorCode, FileId, FileRef, FrameError, Key, NodeEntry, PageAction, PageStatus,
        Request, RequestBody, Response, ResponseBody, Route,
    },
    hot::HotTracker,
    loader::Loader,
    memory::{MemKey, MemoryStats, MemoryTier},
    ring::{self, MemberId, Ring},
    source::page_version,
    spread::{CopyKey, HotPages, Replicas, SpreadConfig},
    tls::Role,
    writeback::{is_wb_tag, unix_ms, WriteBack, WRITE_SLOP},
};

/// One shard's view of the ring: which member it is, and the ring it believes in.
pub struct RingView {
    /// This shard's ring identity.
    pub me: MemberId,
    /// The current ring; replaced when membership changes.
    pub ring: RefCell<Arc<Ring>>,
    /// The nodes of the ring, as `Cluster` answers them.
    pub nodes: RefCell<Arc<Vec<NodeEntry>>>,
    /// Replicas clients may try before the under storage (0: none).
    pub replicas: u8,
}

impl RingView {
    /// Whether this shard owns `key` under its view. An empty ring owns nothing and everything:
    /// a stand-alone node serves every key.
    pub fn owns(&self, key: &Key) -> bool {
        let ring = self.ring.borrow();
        match ring.owner(key.file_id.as_u128(), key.page) {
            Some(m) => m == self.me,
            None => true,
        }
    }

    /// Whether this shard is one of the first `replicas` fallbacks for `key` (the members after
    /// the owner on distinct nodes).
    pub fn is_replica(&self, key: &Key) -> bool {
        if self.replicas == 0 {
            return false;
        }
        let ring = self.ring.borrow();
        ring.replicas(key.file_id.as_u128(), key.page, 1 + self.replicas as usize)
            .contains(&self.me)
    }

    /// Whether this shard is one of the members that keep `key` of a write-back version: the
    /// first `write_replicas` members on distinct nodes, or the [`WRITE_SLOP`] after them that
    /// writers use when some of those are unreachable. An empty ring keeps everything.
    pub fn is_write_member(&self, key: &Key, write_replicas: u8) -> bool {
        let ring = self.ring.borrow();
        if ring.owner(key.file_id.as_u128(), key.page).is_none() {
            return true;
        }
        ring.replicas(
            key.file_id.as_u128(),
            key.page,
            usize::from(write_replicas.max(1)) + WRITE_SLOP,
        )
        .contains(&self.me)
    }

    /// Whether this shard is one of the first `spread` members of `key` (the owner and the
    /// next members on distinct nodes): those a hot page is served by.
    pub fn is_spread_member(&self, key: &Key, spread: u8) -> bool {
        let ring = self.ring.borrow();
        ring.replicas(key.file_id.as_u128(), key.page, usize::from(spread))
            .contains(&self.me)
    }

    /// The ring epoch this shard believes in.
    pub fn epoch(&self) -> u64 {
        self.ring.borrow().epoch()
    }
}

/// The service: one per shard.
pub struct ShardService {
    shard: Rc<Shard>,
    view: Rc<RingView>,
    loader: Option<Rc<Loader>>,
    /// Service time of every request, in microseconds (1 µs to 60 s).
    latency: RefCell<hdrhistogram::Histogram<u64>>,
    /// The node's preload job records (none: `Jobs` is `Unavailable`).
    jobs: RefCell<Option<std::sync::Arc<crate::jobs::JobBoard>>>,
    /// `Fetch` requests served as a replica (a client's owner failed it): fallbacks as this
    /// shard sees them.
    replica_reads: std::cell::Cell<u64>,
    /// `NotOwner` answers (a client routed with another ring).
    not_owner: std::cell::Cell<u64>,
    /// Requests refused because the peer's role does not allow them.
    forbidden: std::cell::Cell<u64>,
    /// The node's write-back side (none: write-back requests are `Unavailable`).
    writeback: RefCell<Option<Arc<dyn WriteBack>>>,
    /// Dirty puts in progress per write-back version (a seal waits for them).
    dirty_inflight: RefCell<HashMap<u128, u32>>,
    /// Versions sealed on this shard: their pages are refused from now on.
    sealed: RefCell<HashSet<u128>>,
    /// Write-back versions whose dirty pages here were recovered (after a restart, or after
    /// etcd counted this node down): a writer may have written newer bytes of them to the
    /// other write members meanwhile, so their pages are `Unverified` to readers unless no
    /// other member holds them ([`Route::Recovered`]), and dropped rather than kept once the
    /// version is flushed.
    unverified: RefCell<HashSet<u128>>,
    /// The memory tier (none: `--memory-cache` 0).
    memory: Option<RefCell<MemoryTier>>,
    /// Bytes sent from the memory tier.
    memory_hit_bytes: Cell<u64>,
    /// Page bytes sent to clients, from anywhere.
    served_bytes: Cell<u64>,
    /// Hottest files and pages, bytes per mount.
    hot: RefCell<HotTracker>,
    /// Read rates of the pages this shard owns: which are hot (`crate::spread`).
    hot_pages: RefCell<HotPages>,
    /// Copies of other owners' hot pages this shard holds.
    copies: RefCell<Replicas>,
}

impl ShardService {
    /// A service for `shard` with ring view `view`, loading misses through `loader` (none: the
    /// node has no under storage, and `Fetch` misses, `StatPath` and `List` are `Unavailable`),
    /// keeping the hottest pages in a memory tier of `memory_bytes` (0: none), spreading hot
    /// pages as `spread` says.
    pub fn new(
        shard: Rc<Shard>,
        view: Rc<RingView>,
        loader: Option<Rc<Loader>>,
        memory_bytes: u64,
        spread: SpreadConfig,
    ) -> Rc<ShardService> {
        let memory = (memory_bytes > 0)
            .then(|| RefCell::new(MemoryTier::new(memory_bytes, shard.page_size())));
        let recovered: HashSet<u128> = shard.dirty_files().iter().map(|d| d.file_id).collect();
        if !recovered.is_empty() {
            tracing::info!(
                versions = recovered.len(),
                "dirty pages recovered: served only where no other write member holds them \
                 until their versions are flushed"
            );
        }
        Rc::new(ShardService {
            unverified: RefCell::new(recovered),
            memory,
            memory_hit_bytes: Cell::new(0),
            served_bytes: Cell::new(0),
            hot: RefCell::new(HotTracker::new()),
            hot_pages: RefCell::new(HotPages::new(spread)),
            copies: RefCell::new(Replicas::new(spread)),
            shard,
            view,
            loader,
            latency: RefCell::new(new_latency_histogram()),
            jobs: RefCell::new(None),
            replica_reads: std::cell::Cell::new(0),
            not_owner: std::cell::Cell::new(0),
            forbidden: std::cell::Cell::new(0),
            writeback: RefCell::new(None),
            dirty_inflight: RefCell::new(HashMap::new()),
            sealed: RefCell::new(HashSet::new()),
        })
    }

    /// Counts every write-back version with dirty pages on this shard as recovered (see
    /// `unverified`): this node was counted down, and writers may have left it behind.
    /// Returns how many versions that is.
    pub fn suspect_dirty(&self) -> usize {
        let mut u = self.unverified.borrow_mut();
        u.extend(self.shard.dirty_files().iter().map(|d| d.file_id));
        u.len()
    }

    /// Takes write-back requests through `wb` (shared by the node's shards).
    pub fn set_writeback(&self, wb: Arc<dyn WriteBack>) {
        *self.writeback.borrow_mut() = Some(wb);
    }

    fn writeback(&self) -> Option<Arc<dyn WriteBack>> {
        self.writeback.borrow().clone()
    }

    /// The write replicas in force (1 without write-back).
    fn write_replicas(&self) -> u8 {
        self.writeback().map_or(1, |w| w.write_replicas())
    }

    /// Requests refused because the peer's role did not allow them, since start.
    pub fn forbidden(&self) -> u64 {
        self.forbidden.get()
    }

    /// `Fetch` requests served as a replica, and `NotOwner` answers, since start.
    pub fn routing_counters(&self) -> (u64, u64) {
        (self.replica_reads.get(), self.not_owner.get())
    }

    /// Keeps and shows job records on `board` (shared by the node's shards).
    pub fn set_jobs(&self, board: std::sync::Arc<crate::jobs::JobBoard>) {
        *self.jobs.borrow_mut() = Some(board);
    }

    /// The memory tier's counters (all zero without one) and the bytes it sent.
    pub fn memory_stats(&self) -> (MemoryStats, u64) {
        let s = self
            .memory
            .as_ref()
            .map_or_else(MemoryStats::default, |m| m.borrow().stats());
        (s, self.memory_hit_bytes.get())
    }

    /// Page bytes sent to clients since start.
    pub fn served_bytes(&self) -> u64 {
        self.served_bytes.get()
    }

    /// The shard's hot files and pages and bytes per mount, as `Hot` answers them.
    pub fn hot_report(&self) -> frame::HotReport {
        self.refresh_mounts();
        let mut report = self.hot.borrow().report(self.shard.id() as u16);
        let now = std::time::Instant::now();
        let hot = self.hot_pages.borrow();
        for p in &mut report.pages {
            p.spread = hot.spread_of(p.key.file_id.as_u128(), p.key.page, now);
        }
        report
    }

    /// The hot-page counters: pages this shard owns that are hot now and that turned hot since
    /// start, and its copies of other owners' hot pages.
    pub fn spread_stats(&self) -> (u32, u64, crate::spread::ReplicaCounts) {
        let (now, turned) = self.hot_pages.borrow().counts(std::time::Instant::now());
        (now, turned, self.copies.borrow().counts())
    }

    /// Drops the copies of hot pages nobody read for the cooling time (from disk and memory).
    /// Returns how many were dropped. The node runs this every few seconds on every shard.
    pub async fn drop_cooled_copies(&self) -> usize {
        let cooled = self.copies.borrow_mut().cooled(std::time::Instant::now());
        for k in &cooled {
            // A ring change may have made this shard the page's owner: then it is its own.
            let key = Key {
                file_id: FileId::from_u128(k.file_id),
                page: k.page,
            };
            if self.view.owns(&key) {
                continue;
            }
            if let Some(m) = &self.memory {
                m.borrow_mut().remove_page(k.file_id, k.page);
            }
            let key = PageKey::new(k.file_id, k.page);
            if let Err(e) = self.shard.remove(&key).await {
                tracing::warn!(error = %e, "dropping a cooled hot-page copy failed");
            }
        }
        cooled.len()
    }

    /// How often [`ShardService::drop_cooled_copies`] should run.
    pub fn sweep_period(&self) -> std::time::Duration {
        (self.hot_pages.borrow().config().cool / 4).max(std::time::Duration::from_millis(250))
    }

    /// Follows the mount table (at most once a second).
    fn refresh_mounts(&self) {
        let now = std::time::Instant::now();
        if !self.hot.borrow().mounts_due(now) {
            return;
        }
        let mounts = self.loader.as_ref().map_or_else(Vec::new, |l| l.mounts());
        self.hot.borrow_mut().set_mounts(&mounts, now);
    }

    fn served(&self, bytes: usize) {
        self.served_bytes
            .set(self.served_bytes.get() + bytes as u64);
    }

    /// Drops every memory entry of `file_id`, and forgets its hot-page copies.
    fn forget_memory(&self, file_id: u128) {
        self.copies.borrow_mut().forget_file(file_id);
        if let Some(m) = &self.memory {
            m.borrow_mut().remove_file(file_id);
        }
    }

    /// The request service-time histogram (microseconds).
    pub fn latency(&self) -> std::cell::Ref<'_, hdrhistogram::Histogram<u64>> {
        self.latency.borrow()
    }
}

/// What a `Fetch` answer is for: the request, the range asked, the page's spread.
#[derive(Clone, Copy)]
struct Slice {
    id: u64,
    offset: u32,
    len: u32,
    spread: u8,
}

/// Room reserved for a reply's frame head beside its body.
const REPLY_HEAD: usize = 4096;

fn reply(request_id: u64, body: ResponseBody, payload: Body) -> Reply {
    let len = match &payload {
        Body::Empty => 0,
        Body::Bytes(b) => b.len(),
        Body::Page(p) => p.len(),
        Body::Shared(b) => b.len(),
    };
    let response = Response { request_id, body };
    let mut head = Vec::with_capacity(128);
    match frame::encode_response(&response, len as u32, &mut head) {
        Ok(()) => Reply {
            head,
            body: payload,
        },
        Err(e) => {
            // Only a bug can get here (our own response breaking a limit): say so, send nothing.
            tracing::error!(error = %e, "encoding a response failed");
            let mut head = Vec::new();
            let err = Response {
                request_id,
                body: ResponseBody::Error {
                    code: ErrorCode::Internal,
                    message: "response encoding failed".into(),
                },
            };
            let _ = frame::encode_response(&err, 0, &mut head);
            Reply {
                head,
                body: Body::Empty,
            }
        }
    }
}

fn error(request_id: u64, code: ErrorCode, message: impl Into<String>) -> Reply {
    let mut message = message.into();
    if message.len() > frame::MAX_MESSAGE_LEN {
        let mut end = frame::MAX_MESSAGE_LEN;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    reply(
        request_id,
        ResponseBody::Error { code, message },
        Body::Empty,
    )
}

/// A request's engine error as the wire's error code. The match is exhaustive: a new engine
/// error must choose its code here.
fn engine_error(request_id: u64, e: &EngineError) -> Reply {
    let code = match e {
        EngineError::BadRange { .. } => ErrorCode::BadRange,
        EngineError::PageTooLarge { .. } | EngineError::BufferTooShort { .. } => {
            ErrorCode::TooLarge
        }
        EngineError::CacheFull | EngineError::QuotaFull { .. } | EngineError::DirtyFull { .. } => {
            ErrorCode::Full
        }
        EngineError::ShardGone => ErrorCode::Unavailable,
        EngineError::Io { .. } => ErrorCode::Io,
    };
    error(request_id, code, e.to_string())
}

/// The least role a request needs. Reading (and asking a node to load pages from its own under
/// storage, which stores only what that storage holds at the version named) is open to every
/// peer; changing what other clients will be served is not.
fn role_needed(body: &RequestBody, payload: &[u8]) -> Role {
    match body {
        RequestBody::WritePage { .. }
        | RequestBody::Invalidate { .. }
        | RequestBody::WriteDirty { .. }
        | RequestBody::Discard { .. }
        | RequestBody::Renew { .. }
        | RequestBody::Change { .. } => Role::Writer,
        // What nodes tell each other: the namespace records and what to do with a version's
        // pages.
        RequestBody::Replicate
        | RequestBody::PullRecords { .. }
        | RequestBody::RecordsOf { .. }
        | RequestBody::RecordsIn { .. }
        | RequestBody::FilePages { .. } => Role::Node,
        // Reading the job records is open; adding one is a change others see.
        RequestBody::Jobs if !payload.is_empty() => Role::Writer,
        RequestBody::RemoveFile { .. } => Role::Admin,
        _ => Role::Reader,
    }
}

/// A request's name, for messages and logs.
fn request_name(body: &RequestBody) -> &'static str {
    match body {
        RequestBody::Ping { .. } => "Ping",
        RequestBody::RingEpoch => "RingEpoch",
        RequestBody::Stat => "Stat",
        RequestBody::ReadRange { .. } => "ReadRange",
        RequestBody::ReadPages { .. } => "ReadPages",
        RequestBody::WritePage { .. } => "WritePage",
        RequestBody::LoadPages { .. } => "LoadPages",
        RequestBody::RemoveFile { .. } => "RemoveFile",
        RequestBody::Fetch { .. } => "Fetch",
        RequestBody::StatPath { .. } => "StatPath",
        RequestBody::List { .. } => "List",
        RequestBody::Cluster => "Cluster",
        RequestBody::Invalidate { .. } => "Invalidate",
        RequestBody::Jobs => "Jobs",
        RequestBody::Counters => "Counters",
        RequestBody::WriteDirty { .. } => "WriteDirty",
        RequestBody::Change { .. } => "Change",
        RequestBody::Replicate => "Replicate",
        RequestBody::PullRecords { .. } => "PullRecords",
        RequestBody::RecordsOf { .. } => "RecordsOf",
        RequestBody::RecordsIn { .. } => "RecordsIn",
        RequestBody::FilePages { .. } => "FilePages",
        RequestBody::Discard { .. } => "Discard",
        RequestBody::WriteBackState { .. } => "WriteBackState",
        RequestBody::Hot => "Hot",
        RequestBody::LoadFiles { .. } => "LoadFiles",
        RequestBody::Attributes { .. } => "Attributes",
        RequestBody::Renew { .. } => "Renew",
    }
}

fn page_key(k: &Key) -> PageKey {
    PageKey::new(k.file_id.as_u128(), k.page)
}

/// A request's payload: after its head in the request buffer, or apart, the first `.1` bytes of
/// a buffer aligned for the disk ([`Service::payload_buffer`]).
enum Payload<'a> {
    Slice(&'a [u8]),
    Apart(DmaBuffer, usize),
}

impl Payload<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Payload::Slice(s) => s,
            Payload::Apart(b, n) => b.as_bytes().get(..*n).unwrap_or_default(),
        }
    }
}

/// Decodes a request as received: its payload's range in the frame, or `None` where it came
/// apart.
fn decode_received(r: &Received) -> Result<(Request, Option<Range<usize>>), FrameError> {
    match &r.apart {
        None => frame::decode_request_frame(&r.frame).map(|(req, range)| (req, Some(range))),
        Some((_, arrived)) => frame::decode_request_head(&r.frame, *arrived).map(|req| (req, None)),
    }
}

impl Service for ShardService {
    fn call(self: Rc<Self>, request: Received, peer: Peer) -> Pin<Box<dyn Future<Output = Reply>>> {
        Box::pin(async move {
            let start = std::time::Instant::now();
            let reply = self.handle(&request.frame, request.apart, peer).await;
            crate::endpoint::recycle_request_buffer(request.frame);
            let micros = start.elapsed().as_micros().max(1) as u64;
            self.latency.borrow_mut().saturating_record(micros);
            reply
        })
    }

    fn payload_buffer(&self, len: usize) -> Option<DmaBuffer> {
        // A page to write; anything longer is answered with an error anyway.
        (len <= self.shard.page_size() as usize).then(|| self.shard.alloc_buffer(len))
    }

    fn reply_bound(&self, request: &Received) -> usize {
        let page = self.shard.page_size();
        let body = match decode_received(request) {
            Ok((r, _)) => match r.body {
                RequestBody::ReadRange { len, .. } | RequestBody::Fetch { len, .. } => {
                    u64::from(len.min(page))
                }
                RequestBody::ReadPages { pages, .. } => pages.len() as u64 * u64::from(page),
                // Its answer's header: one outcome (16 bytes and a message) per file.
                RequestBody::LoadFiles { files, .. } => {
                    files.len() as u64 * (16 + frame::MAX_OUTCOME_MESSAGE_LEN as u64)
                }
                // A page of records at most.
                RequestBody::PullRecords { .. } | RequestBody::RecordsIn { .. } => {
                    u64::from(frame::MAX_RECORDS_PAYLOAD)
                }
                // Two records per path at most (its own and one beneath it; a page holds
                // `MAX_RECORD_BATCH` of the largest).
                RequestBody::RecordsOf { paths } => {
                    (2 * paths.len() as u64 + 1) * u64::from(frame::MAX_RECORDS_PAYLOAD)
                        / frame::MAX_RECORD_BATCH as u64
                }
                // Job listings and counters are charged when ready; the rest carry no body.
                _ => 0,
            },
            // Answered with an error.
            Err(_) => 0,
        };
        usize::try_from(body)
            .unwrap_or(usize::MAX)
            .saturating_add(REPLY_HEAD)
    }
}

impl ShardService {
    async fn handle(&self, raw: &[u8], apart: Option<(DmaBuffer, usize)>, peer: Peer) -> Reply {
        let (req, payload) = match apart {
            None => match frame::decode_request_frame(raw) {
                Ok((req, range)) => (req, Payload::Slice(&raw[range])),
                Err(e) => return bad_frame(&e),
            },
            Some((buf, arrived)) => match frame::decode_request_head(raw, arrived) {
                Ok(req) => (req, Payload::Apart(buf, arrived)),
                Err(e) => return bad_frame(&e),
            },
        };
        let id = req.request_id;
        let needed = role_needed(&req.body, payload.bytes());
        if !peer.role.allows(needed) {
            self.forbidden.set(self.forbidden.get() + 1);
            tracing::warn!(peer = %peer.addr, role = %peer.role, request = request_name(&req.body),
                "request refused: the peer's role does not allow it");
            return error(
                id,
                ErrorCode::Forbidden,
                format!(
                    "{} needs the {needed} role; this connection's certificate gives the {} \
                     role (no certificate: reader). Ask the cluster's operator for a certificate \
                     with `pagectl cert issue --role {needed}`",
                    request_name(&req.body),
                    peer.role
                ),
            );
        }
        self.answer(id, req.body, payload).await
    }

    /// The answer to one decoded, authorized request: a table of the request kinds.
    async fn answer(&self, id: u64, body: RequestBody, payload: Payload<'_>) -> Reply {
        let bytes = payload.bytes();
        match body {
            RequestBody::Ping { nonce } => reply(id, ResponseBody::Pong { nonce }, Body::Empty),
            RequestBody::RingEpoch => reply(
                id,
                ResponseBody::Epoch {
                    epoch: self.view.epoch(),
                },
                Body::Empty,
            ),
            RequestBody::Stat => self.stat(id),
            RequestBody::ReadRange {
                key, offset, len, ..
            } => self.read_range(id, key, offset, len).await,
            RequestBody::ReadPages { pages, .. } => self.read_pages(id, &pages).await,
            RequestBody::WritePage { key, version, .. } => {
                if !self.view.owns(&key) {
                    return self.not_owner(id);
                }
                // Whatever the memory tier held for this page is not what the cache will hold.
                if let Some(m) = &self.memory {
                    m.borrow_mut().remove_page(key.file_id.as_u128(), key.page);
                }
                let key = page_key(&key);
                let put = match payload {
                    Payload::Apart(buf, len) => {
                        self.shard.put_buffer(&key, buf, len, version).await
                    }
                    Payload::Slice(data) => self.shard.put(&key, data, version).await,
                };
                match put {
                    Ok(_) => reply(id, ResponseBody::Written, Body::Empty),
                    Err(e) => engine_error(id, &e),
                }
            }
            RequestBody::RemoveFile { file_id, .. } => {
                self.forget_memory(file_id.as_u128());
                match self.shard.remove_file(file_id.as_u128()).await {
                    Ok(n) => reply(id, ResponseBody::Removed { pages: n as u32 }, Body::Empty),
                    Err(e) => engine_error(id, &e),
                }
            }
            RequestBody::LoadPages { file, pages, .. } => self.load_pages(id, file, pages).await,
            RequestBody::LoadFiles { files, .. } => self.load_files(id, files).await,
            RequestBody::Fetch {
                file,
                page,
                offset,
                len,
                route,
                ..
            } => self.fetch(id, file, page, offset, len, route).await,
            RequestBody::StatPath { path } => {
                let Some(loader) = &self.loader else {
                    return no_source(id);
                };
                match loader.stat(&path).await {
                    Ok(kind) => reply(id, ResponseBody::PathInfo { kind }, Body::Empty),
                    Err(e) => error(id, e.code, e.message),
                }
            }
            RequestBody::List { path, start_after } => {
                let Some(loader) = &self.loader else {
                    return no_source(id);
                };
                match loader.list(&path, &start_after).await {
                    Ok((entries, more)) => {
                        reply(id, ResponseBody::Listing { entries, more }, Body::Empty)
                    }
                    Err(e) => error(id, e.code, e.message),
                }
            }
            RequestBody::Invalidate { path, file_id } => self.invalidate(id, &path, file_id).await,
            RequestBody::Cluster => {
                let body = ResponseBody::ClusterInfo {
                    page_size: self.shard.page_size(),
                    epoch: self.view.epoch(),
                    replicas: self.view.replicas,
                    nodes: self.view.nodes.borrow().as_ref().clone(),
                    mounts: self.loader.as_ref().map_or_else(Vec::new, |l| l.mounts()),
                    write_replicas: self.writeback().map_or(1, |w| w.write_setting()),
                };
                reply(id, body, Body::Empty)
            }
            RequestBody::Counters => self.counters(id),
            RequestBody::Hot => match frame::encode_hot_report(&self.hot_report()) {
                Ok(payload) => reply(id, ResponseBody::Hot, Body::Bytes(payload)),
                Err(e) => error(id, ErrorCode::Internal, format!("hot report: {e}")),
            },
            RequestBody::Jobs => self.jobs(id, bytes),
            RequestBody::WriteDirty {
                key,
                version_tag,
                since,
                ..
            } => {
                self.write_dirty(id, key, &version_tag, since, payload)
                    .await
            }
            RequestBody::Change { op } => {
                let Some(wb) = self.writeback() else {
                    return no_writeback(id);
                };
                match wb.change(op).await {
                    Ok(hlc) => reply(id, ResponseBody::Applied { hlc }, Body::Empty),
                    Err(e) => error(id, e.code, e.message),
                }
            }
            RequestBody::Replicate => {
                let Some(wb) = self.writeback() else {
                    return no_writeback(id);
                };
                let records = match frame::decode_file_records(bytes) {
                    Ok(r) => r,
                    Err(e) => {
                        return error(
                            id,
                            ErrorCode::BadRequest,
                            format!("records: {}", e.peer_message()),
                        )
                    }
                };
                match wb.replicate(records).await {
                    Ok(hlc) => reply(id, ResponseBody::Applied { hlc }, Body::Empty),
                    Err(e) => error(id, e.code, e.message),
                }
            }
            RequestBody::PullRecords { after } => {
                let Some(wb) = self.writeback() else {
                    return no_writeback(id);
                };
                let (records, more) = wb.pull(&after);
                records_answer(id, &records, more)
            }
            RequestBody::RecordsOf { paths } => {
                let Some(wb) = self.writeback() else {
                    return no_writeback(id);
                };
                records_answer(id, &wb.records_of(&paths), false)
            }
            RequestBody::RecordsIn { dir, after, digest } => {
                let Some(wb) = self.writeback() else {
                    return no_writeback(id);
                };
                match wb.records_in(&dir, &after, digest) {
                    Some((records, more)) => records_answer(id, &records, more),
                    None => reply(id, ResponseBody::Same, Body::Empty),
                }
            }
            RequestBody::FilePages { file_id, action } => {
                self.file_pages(id, file_id.as_u128(), action).await
            }
            RequestBody::Discard { version_tag } => self.discard(id, &version_tag).await,
            RequestBody::Renew { version_tag } => self.renew(id, &version_tag),
            RequestBody::WriteBackState { prefix } => {
                let Some(wb) = self.writeback() else {
                    return no_writeback(id);
                };
                if wb.catching_up() {
                    return catching_up(id);
                }
                let summary = wb.summary(&prefix);
                reply(id, ResponseBody::WriteBack { summary }, Body::Empty)
            }
            RequestBody::Attributes { path, version_tag } => {
                let Some(wb) = self.writeback() else {
                    return no_writeback(id);
                };
                if wb.catching_up() {
                    return catching_up(id);
                }
                match wb.attributes(&path, &version_tag) {
                    Some(attrs) => reply(id, ResponseBody::Attributes { attrs }, Body::Empty),
                    None => error(
                        id,
                        ErrorCode::NotFound,
                        format!("{path}: no write-back version {version_tag} there"),
                    ),
                }
            }
        }
    }

    /// A page of a write-back version, kept dirty and durable before the answer.
    async fn write_dirty(
        &self,
        id: u64,
        key: Key,
        tag: &str,
        since: u64,
        payload: Payload<'_>,
    ) -> Reply {
        let Some(wb) = self.writeback() else {
            return no_writeback(id);
        };
        let file = key.file_id.as_u128();
        if !is_wb_tag(tag) || file != ring::file_id("", tag) {
            return error(
                id,
                ErrorCode::BadRequest,
                "WriteDirty needs a write-back version tag and its file id",
            );
        }
        if !self.view.is_write_member(&key, wb.write_replicas()) {
            return self.not_owner(id);
        }
        if self.sealed.borrow().contains(&file) || !wb.takes_pages(file, since) {
            return error(
                id,
                ErrorCode::Changed,
                "this write-back version takes no more pages: it was closed, sealed or deleted \
                 (or flushed, and its record forgotten after --write-records-keep); open the \
                 file for writing again",
            );
        }
        // Whatever the memory tier holds for this page is not what the disk will hold.
        if let Some(m) = &self.memory {
            m.borrow_mut().remove_page(file, key.page);
        }
        *self.dirty_inflight.borrow_mut().entry(file).or_insert(0) += 1;
        let (key, version) = (page_key(&key), page_version(tag));
        let r = match payload {
            Payload::Apart(buf, len) => self.shard.put_dirty_buffer(&key, buf, len, version).await,
            Payload::Slice(data) => self.shard.put_dirty(&key, data, version).await,
        };
        {
            let mut inflight = self.dirty_inflight.borrow_mut();
            if let Some(n) = inflight.get_mut(&file) {
                *n -= 1;
                if *n == 0 {
                    inflight.remove(&file);
                }
            }
        }
        match r {
            Ok(()) => reply(id, ResponseBody::Written, Body::Empty),
            Err(e) => engine_error(id, &e),
        }
    }

    /// The write-back side and the file id of version `tag`, named by a writer's `request`
    /// (`Discard`, `Renew`) about a version it has not committed; the error to answer when the
    /// node has no write-back, the tag is not a write-back one, or a record names the version
    /// (a committed file: its path is deleted to drop it, and its commits keep it alive).
    fn uncommitted_version(
        &self,
        id: u64,
        tag: &str,
        request: &str,
    ) -> Result<(Arc<dyn WriteBack>, u128), Reply> {
        let Some(wb) = self.writeback() else {
            return Err(no_writeback(id));
        };
        if !is_wb_tag(tag) {
            return Err(error(
                id,
                ErrorCode::BadRequest,
                format!("{request} needs a write-back version tag"),
            ));
        }
        let file = ring::file_id("", tag);
        if wb.names(file) {
            return Err(error(
                id,
                ErrorCode::Changed,
                format!(
                    "this write-back version was committed: {request} does not apply to it \
                     (delete its path to drop it)"
                ),
            ));
        }
        Ok((wb, file))
    }

    /// A writer gives up a version it never committed: the puts of it in progress end, and
    /// its pages here are dropped at once (not after the orphan grace), so the room they took
    /// under the dirty limit is free again. A version a record names is committed: deleting
    /// its path is the way to drop it.
    async fn discard(&self, id: u64, tag: &str) -> Reply {
        let file = match self.uncommitted_version(id, tag, "Discard") {
            Ok((_, file)) => file,
            Err(refused) => return refused,
        };
        if let Err(e) = self.page_action(file, PageAction::Seal).await {
            return engine_error(id, &e);
        }
        match self.page_action(file, PageAction::Drop).await {
            Ok(n) => {
                tracing::debug!(pages = n, "dropped the pages of a discarded version");
                reply(id, ResponseBody::Removed { pages: n as u32 }, Body::Empty)
            }
            Err(e) => engine_error(id, &e),
        }
    }

    /// A writer is still writing a version it has not committed yet: its pages here are not
    /// a gone writer's. Answers how many this shard holds, and the orphan grace the writer
    /// must renew within.
    fn renew(&self, id: u64, tag: &str) -> Reply {
        let (wb, file) = match self.uncommitted_version(id, tag, "Renew") {
            Ok(found) => found,
            Err(refused) => return refused,
        };
        let pages = self.shard.renew_dirty(file, unix_ms());
        let grace_ms = u64::try_from(wb.orphan_grace().as_millis()).unwrap_or(u64::MAX);
        reply(id, ResponseBody::Held { pages, grace_ms }, Body::Empty)
    }

    /// What another node says to do with a write-back version's pages on this shard.
    async fn file_pages(&self, id: u64, file: u128, action: PageAction) -> Reply {
        match self.page_action(file, action).await {
            Ok(n) => reply(id, ResponseBody::Removed { pages: n as u32 }, Body::Empty),
            Err(e) => engine_error(id, &e),
        }
    }

    /// Does `action` to write-back version `file`'s pages on this shard: makes them ordinary
    /// cached pages (clean), drops them, or seals the version (refuses its pages from now on,
    /// after the puts in progress end). Returns the pages affected.
    pub async fn page_action(&self, file: u128, action: PageAction) -> Result<usize, EngineError> {
        match action {
            PageAction::Clean => {
                self.sealed.borrow_mut().remove(&file);
                // Recovered pages may be older than what the store now holds: not kept.
                if self.unverified.borrow_mut().remove(&file) {
                    self.forget_memory(file);
                    return self.shard.discard_file(file).await;
                }
                self.shard.mark_clean(file).await
            }
            PageAction::Drop => {
                self.sealed.borrow_mut().remove(&file);
                self.unverified.borrow_mut().remove(&file);
                self.shard.discard_file(file).await
            }
            PageAction::Seal => {
                self.sealed.borrow_mut().insert(file);
                // The puts already accepted finish before the seal is answered.
                while self.dirty_inflight.borrow().contains_key(&file) {
                    glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
                }
                Ok(0)
            }
        }
    }

    /// Write-back version `file`, replaced or deleted, may still be open for reading: its
    /// pages become ordinary cached pages ([`PageAction::Clean`]) that are evicted before
    /// any other, and leave the memory tier and the hot copies (a reader of the old version
    /// reads them from disk, or from the owner). Returns the pages demoted.
    pub async fn retire(&self, file: u128) -> Result<usize, EngineError> {
        self.page_action(file, PageAction::Clean).await?;
        self.forget_memory(file);
        Ok(self.shard.demote_file(file))
    }

    /// `NotOwner`, counted: the client routed with another ring.
    fn not_owner(&self, id: u64) -> Reply {
        self.not_owner.set(self.not_owner.get() + 1);
        reply(
            id,
            ResponseBody::NotOwner {
                epoch: self.view.epoch(),
            },
            Body::Empty,
        )
    }

    fn stat(&self, id: u64) -> Reply {
        let s = self.shard.stats();
        let body = ResponseBody::Stat {
            shard: s.shard as u16,
            pages: s.pages,
            bytes: s.bytes,
            capacity_bytes: s.capacity_bytes,
            hits: s.hits,
            misses: s.misses,
        };
        reply(id, body, Body::Empty)
    }

    /// A cached page's range, sent from the buffer the disk read went into.
    async fn read_range(&self, id: u64, key: Key, offset: u32, len: u32) -> Reply {
        if !self.view.owns(&key) {
            return self.not_owner(id);
        }
        match self.shard.read(&page_key(&key), offset, len).await {
            Ok(Some((data, info))) => {
                self.served(data.len());
                reply(
                    id,
                    ResponseBody::Data {
                        page_len: info.len,
                        version: info.version,
                        spread: 0,
                    },
                    Body::Page(data),
                )
            }
            Ok(None) => reply(id, ResponseBody::Miss, Body::Empty),
            Err(e) => engine_error(id, &e),
        }
    }

    /// Whole cached pages, one status each, their bytes concatenated.
    async fn read_pages(&self, id: u64, pages: &[Key]) -> Reply {
        let mut entries = Vec::with_capacity(pages.len());
        let mut body = Vec::new();
        for key in pages {
            if !self.view.owns(key) {
                entries.push(PageStatus::NotOwner);
                continue;
            }
            match self.shard.get(&page_key(key), 0, u32::MAX).await {
                Ok(Some(data)) => {
                    if body.len() + data.len() > frame::MAX_PAYLOAD as usize {
                        return error(
                            id,
                            ErrorCode::TooLarge,
                            "the pages asked for exceed one response; ask for fewer",
                        );
                    }
                    entries.push(PageStatus::Data {
                        len: data.len() as u32,
                    });
                    body.extend_from_slice(&data);
                }
                Ok(None) => entries.push(PageStatus::Miss),
                Err(e) => return engine_error(id, &e),
            }
        }
        self.served(body.len());
        reply(id, ResponseBody::Pages { entries }, Body::Bytes(body))
    }

    /// A page of a file at a version: from the memory tier or the disk cache if it holds that
    /// version, else loaded from the under storage (and stored).
    async fn fetch(
        &self,
        id: u64,
        file: FileRef,
        page: u64,
        offset: u32,
        len: u32,
        route: Route,
    ) -> Reply {
        let key = Key {
            file_id: file.file_id,
            page,
        };
        let written = is_wb_tag(&file.version_tag);
        let owner = self.view.owns(&key);
        if !owner {
            let member = match route {
                Route::Owner => false,
                Route::Fallback => {
                    self.view.is_replica(&key)
                        || (written && self.view.is_write_member(&key, self.write_replicas()))
                }
                Route::Recovered => {
                    written && self.view.is_write_member(&key, self.write_replicas())
                }
                // Pages of files written through the cluster are never spread (their write
                // members hold them; see `crate::spread`).
                Route::Hot => {
                    !written
                        && self.hot_pages.borrow().config().enabled()
                        && self
                            .view
                            .is_spread_member(&key, self.hot_pages.borrow().config().spread)
                }
            };
            if !member {
                return self.not_owner(id);
            }
            if matches!(route, Route::Fallback | Route::Recovered) {
                self.replica_reads.set(self.replica_reads.get() + 1);
            }
        }
        if file.file_id.as_u128() != ring::file_id(&file.path, &file.version_tag) {
            return error(
                id,
                ErrorCode::BadRequest,
                "file_id does not match the path and version tag",
            );
        }
        self.refresh_mounts();
        let now = std::time::Instant::now();
        // The owner counts the page's reads; a hot page's answer tells readers to spread.
        let spread = if owner && !written {
            let s = self
                .hot_pages
                .borrow_mut()
                .record(file.file_id.as_u128(), page, now);
            // Never more members than the ring has nodes to put them on.
            let nodes = self.view.ring.borrow().node_count();
            match s.min(u8::try_from(nodes).unwrap_or(u8::MAX)) {
                0 | 1 => 0,
                n => n,
            }
        } else {
            0
        };
        let copy = (!owner && route == Route::Hot).then_some(CopyKey {
            file_id: file.file_id.as_u128(),
            page,
        });
        if let Some(k) = copy {
            self.copies.borrow_mut().read(k, now);
        }
        let version = page_version(&file.version_tag);
        let mkey = MemKey {
            file_id: file.file_id.as_u128(),
            page,
            version,
        };
        let at = Slice {
            id,
            offset,
            len,
            spread,
        };
        // Memory first: no disk read, and the same bytes for every reader.
        let held = self.memory.as_ref().and_then(|m| m.borrow_mut().get(&mkey));
        if let Some(bytes) = held {
            let sent = bytes
                .len()
                .saturating_sub(offset as usize)
                .min(len as usize);
            self.memory_hit_bytes
                .set(self.memory_hit_bytes.get() + sent as u64);
            return self.send_slice(at, &file, page, bytes, true);
        }
        match self.shard.read(&page_key(&key), offset, len).await {
            // A page is served only for the version it was stored for (a page under this
            // key with another version was not loaded from this object: reload it).
            Ok(Some((_, info)))
                if info.dirty
                    && route != Route::Recovered
                    && self.unverified.borrow().contains(&file.file_id.as_u128()) =>
            {
                return error(
                    id,
                    ErrorCode::Unverified,
                    format!(
                        "{}: page {page} was recovered here; the other write members may hold \
                         newer bytes",
                        file.path
                    ),
                );
            }
            Ok(Some((data, info))) if info.version == version => {
                // A dirty page (a write-back version not flushed yet) may be written again
                // under the same version: it is never copied into memory.
                let copied = if info.dirty {
                    None
                } else {
                    self.copy_in(&key, mkey, &data, info.len, offset).await
                };
                if let Some(bytes) = copied {
                    return self.send_slice(at, &file, page, bytes, true);
                }
                self.count_read(&file, page, data.len(), true);
                return reply(
                    id,
                    ResponseBody::Data {
                        page_len: info.len,
                        version: info.version,
                        spread,
                    },
                    Body::Page(data),
                );
            }
            Ok(Some(_)) => {
                tracing::warn!(path = %file.path, page, "cached page has another version; reloading it");
            }
            Ok(None) => {}
            Err(e @ EngineError::BadRange { .. }) => return engine_error(id, &e),
            // A failing cache disk must not fail the read: load the page instead.
            Err(e) => tracing::warn!(error = %e, "cache read failed; loading the page"),
        }
        let Some(loader) = &self.loader else {
            return error(
                id,
                ErrorCode::Unavailable,
                "this node has no under storage configured",
            );
        };
        // A replica of a hot page copies it from the owner (peer to peer), not from the store.
        let loaded = match copy {
            Some(k) => {
                let r = loader.copy_from_owner(&file, page).await;
                if r.is_ok() {
                    self.copies
                        .borrow_mut()
                        .copied(k, std::time::Instant::now());
                }
                r
            }
            None => loader.load(&file, page).await,
        };
        match loaded {
            Ok(loaded) => {
                if loaded.read_store {
                    self.hot
                        .borrow_mut()
                        .read_from_store(&file.path, loaded.bytes.len() as u64);
                }
                if let Some(m) = &self.memory {
                    m.borrow_mut().offer_loaded(mkey, loaded.bytes.clone());
                }
                self.send_slice(at, &file, page, loaded.bytes, !loaded.read_store)
            }
            Err(e) => error(id, e.code, e.message),
        }
    }

    /// On a disk hit of a page the memory tier wants (its second read while the tier remembers
    /// it), copies the whole page into the tier and returns its bytes there; the disk buffer
    /// `data` holds the range asked for, so a partial range means one more read of the page.
    async fn copy_in(
        &self,
        key: &Key,
        mkey: MemKey,
        data: &pagestore_engine::PageData,
        page_len: u32,
        offset: u32,
    ) -> Option<bytes::Bytes> {
        let memory = self.memory.as_ref()?;
        if !memory.borrow_mut().wants_from_disk(&mkey) {
            return None;
        }
        let bytes = if offset == 0 && data.len() == page_len as usize {
            bytes::Bytes::copy_from_slice(data)
        } else {
            match self.shard.read(&page_key(key), 0, u32::MAX).await {
                Ok(Some((whole, info))) if info.version == mkey.version && !info.dirty => {
                    bytes::Bytes::copy_from_slice(&whole)
                }
                _ => return None,
            }
        };
        memory.borrow_mut().admit_copy(mkey, bytes.clone());
        Some(bytes)
    }

    /// Counts one read of `bytes` bytes of `file`'s page `page` (hot files and pages, bytes
    /// served, and, `from_cache`, bytes kept off its mount's store).
    fn count_read(&self, file: &FileRef, page: u64, bytes: usize, from_cache: bool) {
        self.served(bytes);
        let mut hot = self.hot.borrow_mut();
        hot.record_read(file.file_id.as_u128(), &file.path, page, bytes as u64);
        if from_cache {
            hot.served_from_cache(&file.path, bytes as u64);
        }
    }

    /// Answers a `Fetch` with `at.offset..at.offset + at.len` of the whole page `bytes` (held
    /// in memory, or just loaded), without copying them.
    fn send_slice(
        &self,
        at: Slice,
        file: &FileRef,
        page: u64,
        bytes: bytes::Bytes,
        from_cache: bool,
    ) -> Reply {
        let Slice {
            id,
            offset,
            len,
            spread,
        } = at;
        let start = offset as usize;
        if start > bytes.len() {
            return error(
                id,
                ErrorCode::BadRange,
                format!(
                    "offset {offset} is past the end of the page ({} bytes)",
                    bytes.len()
                ),
            );
        }
        let end = start.saturating_add(len as usize).min(bytes.len());
        self.count_read(file, page, end - start, from_cache);
        reply(
            id,
            ResponseBody::Data {
                page_len: bytes.len() as u32,
                version: page_version(&file.version_tag),
                spread,
            },
            Body::Shared(bytes.slice(start..end)),
        )
    }

    /// Forgets a path's metadata and drops a file's cached pages.
    async fn invalidate(&self, id: u64, path: &str, file_id: FileId) -> Reply {
        if let Some(loader) = &self.loader {
            loader.forget(path);
        }
        if file_id.as_u128() == 0 {
            return reply(id, ResponseBody::Removed { pages: 0 }, Body::Empty);
        }
        self.forget_memory(file_id.as_u128());
        match self.shard.remove_file(file_id.as_u128()).await {
            Ok(n) => reply(id, ResponseBody::Removed { pages: n as u32 }, Body::Empty),
            Err(e) => engine_error(id, &e),
        }
    }

    fn counters(&self, id: u64) -> Reply {
        let s = self.shard.stats();
        let (ufs_bytes, ufs_reads, ufs_errors, coalesced, ufs_repeat_reads) =
            self.loader.as_ref().map_or((0, 0, 0, 0, 0), |l| {
                let st = l.stats();
                (
                    st.ufs_bytes.get(),
                    st.ufs_reads.get(),
                    st.ufs_errors.get(),
                    st.coalesced.get(),
                    st.ufs_repeat_reads.get(),
                )
            });
        let (memory, memory_hit_bytes) = self.memory_stats();
        let (hot_now, hot_turned, copies) = self.spread_stats();
        let (owner_copies, owner_copy_failures) = self.loader.as_ref().map_or((0, 0), |l| {
            let st = l.stats();
            (st.owner_copies.get(), st.owner_copy_failures.get())
        });
        let counters = frame::ShardCounters {
            shard: s.shard as u16,
            pages: s.pages,
            bytes: s.bytes,
            capacity_bytes: s.capacity_bytes,
            hits: s.hits,
            misses: s.misses,
            hit_bytes: s.hit_bytes,
            ufs_reads,
            ufs_bytes,
            ufs_errors,
            evictions: s.evictions,
            checksum_failures: s.checksum_failures,
            replica_reads: self.replica_reads.get(),
            not_owner: self.not_owner.get(),
            forbidden: self.forbidden.get(),
            epoch: self.view.epoch(),
            coalesced,
            ufs_repeat_reads,
            served_bytes: self.served_bytes.get(),
            memory_hits: memory.hits,
            memory_hit_bytes,
            memory_bytes: memory.bytes,
            memory_capacity: memory.capacity,
            memory_admissions: memory.admissions,
            memory_evictions: memory.evictions,
            hot_turned,
            hot_now: u64::from(hot_now),
            replica_copies: owner_copies,
            replica_copy_failures: owner_copy_failures,
            replicas_held: u64::from(copies.held),
            replicas_dropped: copies.dropped,
            replica_hot_reads: copies.reads,
        };
        match frame::encode_counters(&counters) {
            Ok(payload) => reply(id, ResponseBody::Counters, Body::Bytes(payload)),
            Err(e) => error(id, ErrorCode::Internal, format!("counters: {e}")),
        }
    }

    /// The node's job records, after keeping the one in `payload` (if any).
    fn jobs(&self, id: u64, payload: &[u8]) -> Reply {
        let Some(board) = self.jobs.borrow().clone() else {
            return error(id, ErrorCode::Unavailable, "this node keeps no job records");
        };
        if !payload.is_empty() {
            let kept = frame::decode_job_record(payload).and_then(|r| board.report(r));
            if let Err(e) = kept {
                return error(
                    id,
                    ErrorCode::BadRequest,
                    format!("job record: {}", e.peer_message()),
                );
            }
        }
        match frame::encode_job_records(&board.records()) {
            Ok(payload) => reply(id, ResponseBody::Jobs, Body::Bytes(payload)),
            Err(e) => error(id, ErrorCode::Internal, format!("job records: {e}")),
        }
    }
}

impl ShardService {
    /// Preloading: every page of `pages` this shard owns and does not hold yet is loaded from
    /// the under storage (all at once; the loader bounds the store requests in flight).
    async fn load_pages(&self, id: u64, file: frame::FileRef, pages: Vec<u64>) -> Reply {
        if file.file_id.as_u128() != ring::file_id(&file.path, &file.version_tag) {
            return error(
                id,
                ErrorCode::BadRequest,
                "file_id does not match the path and version tag",
            );
        }
        let Some(loader) = &self.loader else {
            return no_source(id);
        };
        self.refresh_mounts();
        let mut tasks = Vec::new();
        for page in pages {
            let key = Key {
                file_id: file.file_id,
                page,
            };
            if !self.view.owns(&key) {
                return reply(
                    id,
                    ResponseBody::NotOwner {
                        epoch: self.view.epoch(),
                    },
                    Body::Empty,
                );
            }
            let version = page_version(&file.version_tag);
            if self
                .shard
                .page_info(&page_key(&key))
                .is_some_and(|i| i.version == version)
            {
                continue;
            }
            let (loader, file) = (loader.clone(), file.clone());
            tasks.push(glommio::spawn_local(async move {
                loader.load_and_keep(&file, page).await
            }));
        }
        let (mut loaded, mut bytes, mut failed) = (0u32, 0u64, None);
        for t in tasks {
            match t.await {
                Ok(l) => {
                    loaded += 1;
                    bytes += l.bytes.len() as u64;
                    if l.read_store {
                        self.hot
                            .borrow_mut()
                            .read_from_store(&file.path, l.bytes.len() as u64);
                    }
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) => error(
                id,
                e.code,
                format!("{} (pages loaded before the failure: {loaded})", e.message),
            ),
            None => reply(
                id,
                ResponseBody::Loaded {
                    pages: loaded,
                    bytes,
                },
                Body::Empty,
            ),
        }
    }
}

/// What one file of a `LoadFiles` came to on this shard.
#[derive(Default)]
struct FileTally {
    loaded: u32,
    bytes: u64,
    /// Bytes this request read from the store (the rest joined loads in flight).
    store_bytes: u64,
    failed: Option<crate::source::SourceError>,
}

impl ShardService {
    /// Preloading many files in one request: every page named that this shard does not hold
    /// at the file's version is loaded from the under storage through the loader (its single
    /// flight and its bound on store requests), at most twice the loader's bound at once, and
    /// kept before the answer. One outcome per file: a file that fails (a wrong file id, the
    /// store's `NotFound`, `Changed`, `Io` ...) fails alone, and its pages not started yet are
    /// not loaded. `NotOwner` (nothing loaded) if any page named is not this shard's.
    async fn load_files(&self, id: u64, files: Vec<frame::LoadFile>) -> Reply {
        let Some(loader) = &self.loader else {
            return no_source(id);
        };
        for f in &files {
            for &page in &f.pages {
                let key = Key {
                    file_id: f.file.file_id,
                    page,
                };
                if !self.view.owns(&key) {
                    return self.not_owner(id);
                }
            }
        }
        self.refresh_mounts();
        let tallies: Rc<RefCell<Vec<FileTally>>> = Rc::new(RefCell::new(
            files.iter().map(|_| FileTally::default()).collect(),
        ));
        let mut jobs = std::collections::VecDeque::new();
        for (i, f) in files.iter().enumerate() {
            if f.file.file_id.as_u128() != ring::file_id(&f.file.path, &f.file.version_tag) {
                tallies.borrow_mut()[i].failed = Some(crate::source::SourceError::new(
                    ErrorCode::BadRequest,
                    "file_id does not match the path and version tag",
                ));
                continue;
            }
            let version = page_version(&f.file.version_tag);
            for &page in &f.pages {
                let key = PageKey::new(f.file.file_id.as_u128(), page);
                if self
                    .shard
                    .page_info(&key)
                    .is_some_and(|i| i.version == version)
                {
                    continue;
                }
                jobs.push_back((i, page));
            }
        }
        let files = Rc::new(files);
        let jobs = Rc::new(RefCell::new(jobs));
        let workers = (loader.max_inflight() * 2).clamp(1, jobs.borrow().len().max(1));
        let mut running = Vec::with_capacity(workers);
        for _ in 0..workers {
            let (loader, files, jobs, tallies, shard) = (
                loader.clone(),
                files.clone(),
                jobs.clone(),
                tallies.clone(),
                self.shard.clone(),
            );
            running.push(glommio::spawn_local(async move {
                loop {
                    let Some((i, page)) = jobs.borrow_mut().pop_front() else {
                        return;
                    };
                    // A file that failed loads no more pages.
                    if tallies.borrow()[i].failed.is_some() {
                        continue;
                    }
                    // Kept meanwhile (the same page named twice, or by another request):
                    // nothing to load.
                    let file = &files[i].file;
                    let key = PageKey::new(file.file_id.as_u128(), page);
                    let version = page_version(&file.version_tag);
                    if shard.page_info(&key).is_some_and(|i| i.version == version) {
                        continue;
                    }
                    let r = loader.load_and_keep(&files[i].file, page).await;
                    let mut t = tallies.borrow_mut();
                    let t = &mut t[i];
                    match r {
                        Ok(l) => {
                            t.loaded += 1;
                            t.bytes += l.bytes.len() as u64;
                            if l.read_store {
                                t.store_bytes += l.bytes.len() as u64;
                            }
                        }
                        Err(e) => {
                            t.failed.get_or_insert(e);
                        }
                    }
                }
            }));
        }
        for w in running {
            w.await;
        }
        let tallies = std::mem::take(&mut *tallies.borrow_mut());
        let mut outcomes = Vec::with_capacity(tallies.len());
        for (f, t) in files.iter().zip(tallies) {
            if t.store_bytes > 0 {
                self.hot
                    .borrow_mut()
                    .read_from_store(&f.file.path, t.store_bytes);
            }
            outcomes.push(match t.failed {
                None => frame::FileOutcome::Loaded {
                    pages: t.loaded,
                    bytes: t.bytes,
                },
                Some(e) => frame::FileOutcome::Failed {
                    code: e.code,
                    loaded: t.loaded,
                    message: clip(e.message, frame::MAX_OUTCOME_MESSAGE_LEN),
                },
            });
        }
        reply(id, ResponseBody::FilesLoaded { outcomes }, Body::Empty)
    }
}

/// `text` cut to at most `max` bytes, at a character boundary.
fn clip(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// A histogram for service times in microseconds, 1 µs to 60 s at 3 significant digits.
fn new_latency_histogram() -> hdrhistogram::Histogram<u64> {
    match hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 3) {
        Ok(h) => h,
        // The bounds are constants that hdrhistogram accepts; fall back to auto-resizing.
        Err(_) => hdrhistogram::Histogram::new(3).unwrap_or_else(|_| unreachable!()),
    }
}

fn no_writeback(id: u64) -> Reply {
    error(
        id,
        ErrorCode::Unavailable,
        "this node takes no write-back requests",
    )
}

fn catching_up(id: u64) -> Reply {
    error(
        id,
        ErrorCode::Unavailable,
        "this node is still taking its peers' write-back records after its start (it may have \
         missed changes while it was down)",
    )
}

/// A `Records` answer of `records` (`more`: whether the asker should ask again after them).
fn records_answer(id: u64, records: &[frame::FileRecord], more: bool) -> Reply {
    match frame::encode_file_records(records) {
        Ok(p) => reply(id, ResponseBody::Records { more }, Body::Bytes(p)),
        Err(e) => error(id, ErrorCode::Internal, format!("records: {e}")),
    }
}

fn no_source(id: u64) -> Reply {
    error(
        id,
        ErrorCode::Unavailable,
        "this node has no under storage configured",
    )
}

fn bad_frame(e: &FrameError) -> Reply {
    error(0, e.error_code(), e.peer_message())
}
