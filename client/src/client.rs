//! The cluster client: resolves logical paths to objects and page keys, fetches pages from
//! their owning shards over QUIC (in parallel, bounded), and falls back to a replica and then to
//! the under storage when an owner is unreachable, so that a reader gets correct bytes while any
//! worker is down.

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    path::Path,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, RwLock, Weak,
    },
    time::{Duration, Instant},
};

use crate::{
    pool::{ClientError, Pool, PoolOptions},
    spread::HotMap,
    timing::{HedgeBudget, Latency},
};
use bytes::{Bytes, BytesMut};
use futures_util::{future::OptionFuture, stream, StreamExt, TryStreamExt};
use pagestore_protocol::{
    frame::{
        self, DirEntry, ErrorCode, FileId, FileRef, HotReport, JobRecord, MountEntry, PathKind,
        Request, RequestBody, ResponseBody, Route, ShardCounters,
    },
    members::{parse_member_file, Membership, NodeInfo},
    ring::{path_hash, MemberId, RingConfig},
    writeback::{effective_replicas, is_wb_tag, WritePolicy, WRITE_SLOP},
};

use crate::{
    etcd::{ClusterState, Etcd, EtcdOptions},
    ufs::{MountTable, ObjectInfo, UfsError},
};

/// The underlying error of an [`Error`] (any error type: a [`ClientError`], a [`UfsError`], an
/// [`std::io::Error`], a TLS or etcd error).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a client call failed.
///
/// **Messages and sources.** Every message is complete on its own: where a failure has an
/// underlying error, the message quotes that error's text where the sentence needs it (so a
/// log line with `{e}` says everything), and `source()` returns the error itself, typed, for
/// programs that inspect it and for printers that walk the chain. A chain printer therefore
/// skips a cause whose text the message already holds, as `pagestore_tools::error_chain` does;
/// the engine's I/O errors follow the same rule. The variants that can have an underlying error
/// are [`Error::Unavailable`] (a [`ClientError`] from the pool, a [`UfsError::Store`], an etcd
/// error, a malformed record) and [`Error::Config`] (an I/O error, a TLS or etcd error); the
/// others are answers, whose text is the whole story. Build those two with
/// [`Error::unavailable`], [`Error::unavailable_from`], [`Error::config`] and
/// [`Error::config_from`].
///
/// A [`UfsError::Store`] source shows the store's own error unedited: its text may quote an
/// endpoint URL with credentials, which the message leaves out (`ufs::scrub`). Print a chain
/// through `ufs::scrub`, as `error_chain` does.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The path does not exist.
    #[error("{0}: no such file or directory")]
    NotFound(String),
    /// The path is a directory where a file was expected.
    #[error("{0}: is a directory")]
    IsDir(String),
    /// The path is a file where a directory was expected.
    #[error("{0}: not a directory")]
    NotDir(String),
    /// A conditional write found the path holding something else than it expected
    /// ([`crate::WriteOptions::expect`]); nothing was written.
    #[error("precondition failed: {0}")]
    Precondition(String),
    /// The path is not acceptable (relative, `..`).
    #[error("bad path: {0}")]
    BadPath(String),
    /// An argument other than the path is not acceptable (attributes over their limits).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The object changed since it was opened; open it again.
    #[error("{0}")]
    Changed(String),
    /// The byte range cannot be served.
    #[error("bad range: {0}")]
    BadRange(String),
    /// Neither the cluster nor (with fallback on) the under storage could answer.
    #[error("unavailable: {message}")]
    Unavailable {
        /// What failed, quoting the source's text.
        message: String,
        /// The underlying error, when there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// Client configuration (cluster file, TLS, mounts) is wrong.
    #[error("configuration: {message}")]
    Config {
        /// What is wrong, quoting the source's text.
        message: String,
        /// The underlying error, when there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// The cluster refused the request: this client's certificate does not give the role it
    /// needs (the message names both).
    #[error("refused: {0}")]
    Forbidden(String),
    /// The path exists already (a directory made twice, a rename without replace); the text
    /// names it.
    #[error("{0}")]
    Exists(String),
    /// The directory is not empty; the text names it.
    #[error("{0}")]
    NotEmpty(String),
    /// The cluster cannot take the data: its dirty limit or its cache is full, and waiting for
    /// flushes did not make room in time.
    #[error("no space: {0}")]
    NoSpace(String),
    /// The path's mount does not take this write here (a `through` mount without the store's
    /// credentials on this client, or a mount this request cannot change).
    #[error("read-only: {0}")]
    ReadOnly(String),
}

impl Error {
    /// [`Error::Unavailable`] without an underlying error.
    pub fn unavailable(message: impl Into<String>) -> Error {
        Error::Unavailable {
            message: message.into(),
            source: None,
        }
    }

    /// [`Error::Unavailable`] caused by `source`; `message` quotes its text.
    pub fn unavailable_from(message: impl Into<String>, source: impl Into<BoxError>) -> Error {
        Error::Unavailable {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// [`Error::Config`] without an underlying error.
    pub fn config(message: impl Into<String>) -> Error {
        Error::Config {
            message: message.into(),
            source: None,
        }
    }

    /// [`Error::Config`] caused by `source`; `message` quotes its text.
    pub fn config_from(message: impl Into<String>, source: impl Into<BoxError>) -> Error {
        Error::Config {
            message: message.into(),
            source: Some(source.into()),
        }
    }
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        use std::io::ErrorKind as K;
        let kind = match &e {
            Error::NotFound(_) => K::NotFound,
            Error::IsDir(_) => K::IsADirectory,
            Error::NotDir(_) => K::NotADirectory,
            Error::BadPath(_) | Error::BadRange(_) | Error::Invalid(_) => K::InvalidInput,
            Error::Changed(_) => K::StaleNetworkFileHandle,
            Error::Unavailable { .. } => K::Other,
            Error::Config { .. } => K::InvalidInput,
            Error::Forbidden(_) => K::PermissionDenied,
            Error::Exists(_) => K::AlreadyExists,
            Error::NotEmpty(_) => K::DirectoryNotEmpty,
            Error::NoSpace(_) => K::StorageFull,
            Error::ReadOnly(_) => K::ReadOnlyFilesystem,
            Error::Precondition(_) => K::AlreadyExists,
        };
        std::io::Error::new(kind, e)
    }
}

/// A store failure is [`Error::Unavailable`] with the [`UfsError`] as its source (and the
/// store's error as the source of that). The other kinds are answers or settings that carry
/// only their text, which becomes the message of the same kind here.
impl From<UfsError> for Error {
    fn from(e: UfsError) -> Error {
        match e {
            UfsError::NotFound(p) => Error::NotFound(p),
            UfsError::BadPath(m) => Error::BadPath(m),
            e @ UfsError::Changed { .. } => Error::Changed(e.to_string()),
            UfsError::Config(m) => Error::config(crate::ufs::scrub(&m)),
            e @ UfsError::Store(..) => Error::unavailable_from(e.to_string(), e),
        }
    }
}

/// Where the client finds the cluster.
#[derive(Clone, Debug)]
pub enum ClusterSource {
    /// A static member file (see `docs/OPERATIONS.md`).
    File(std::path::PathBuf),
    /// Any member's base address; the member list is asked from it, and asked again from
    /// the members every [`ClientOptions::membership_refresh`] and when a member says it does
    /// not own a key: a reader follows joins and departures without access to etcd.
    Addr(SocketAddr),
    /// Membership in etcd (`etcd://HOST:PORT[,...][/CLUSTER]`, `etcds://` for TLS), followed
    /// while the client lives: members that join or leave are routed to (or around) within
    /// seconds. Needs read access to etcd ([`ClientOptions::etcd`]): meant for operators'
    /// tools; readers should use [`ClusterSource::Addr`].
    Etcd(String),
}

impl ClusterSource {
    /// `etcd://...` or `etcds://...` is etcd, `IP:PORT` an address, anything else a member
    /// file path.
    pub fn parse(s: &str) -> ClusterSource {
        if crate::etcd::is_etcd_url(s) {
            return ClusterSource::Etcd(s.to_string());
        }
        match s.parse::<SocketAddr>() {
            Ok(a) => ClusterSource::Addr(a),
            Err(_) => ClusterSource::File(s.into()),
        }
    }
}

/// Client settings.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Read from a replica, then from the under storage, when an owner fails (default on).
    pub fallback: bool,
    /// Time allowed for one request to a shard, connecting included (default 3 s). A member
    /// that does not answer within it is marked dead. Once a member has answered, a request
    /// waiting on it is given up sooner when the member goes silent: see `min_silence`.
    pub call_timeout: Duration,
    /// A request is given up, and its member backed off, when the member has answered nothing
    /// for [`timing::SILENCE_FACTOR`] times its usual answer time (never less than this,
    /// default 200 ms, nor more than `call_timeout`) and then misses a ping for as long. A
    /// killed node is thus left within a fraction of a second; a busy one, which keeps
    /// answering pings, is not. A store hedge (`hedge_min`) waits half as long at least, so it
    /// comes first.
    ///
    /// [`timing::SILENCE_FACTOR`]: crate::timing::SILENCE_FACTOR
    pub min_silence: Duration,
    /// Time allowed for a request that may wait on the under storage (`Fetch`, `StatPath`,
    /// `List`; default 60 s, at least `call_timeout`) once some member has answered this client
    /// (a request still waiting when the call timeout ends, with no member having answered
    /// yet, not even a member of another node pinged meanwhile, is given up then). The
    /// member may be loading from a slow store, or queueing behind other loads: as long as it
    /// answers pings (see `min_silence`) the request is waited for, because giving it up (and
    /// backing the member off) would make a replica and then this client read the same pages
    /// from the store again.
    pub store_timeout: Duration,
    /// A page request still unanswered after its member's usual answer time (never sooner than
    /// this, default 20 ms, nor later than `call_timeout`) may be hedged: asked of a second
    /// source too, the first answer taken and the other request cancelled. A member that holds
    /// the page as well (another write member of a file written through the cluster) is asked
    /// then; a `--replicas` replica, the owner of a hot page read from one of its spread
    /// members, or the under storage only once the member has been silent that long and then
    /// missed a ping for as long (each at least half of `min_silence`, so such a hedge comes
    /// before the silence rule gives the request up; a member that answers pings is working
    /// on the request, perhaps waiting on a slow store, and is left to it). See `hedge_ratio`.
    pub hedge_min: Duration,
    /// Hedges allowed, as a share of page requests (default 0.05: 5%), with at most
    /// `hedge_burst` (default 10) at once after a quiet spell: a token bucket
    /// ([`HedgeBudget`]). 0 turns hedging off. Hedging is off with `fallback` off.
    ///
    /// [`HedgeBudget`]: crate::timing::HedgeBudget
    pub hedge_ratio: f64,
    /// See `hedge_ratio`.
    pub hedge_burst: u32,
    /// Page requests in flight per read call (default 8).
    pub parallel: usize,
    /// Pages a file handle fetches ahead of a sequential reader (default 4).
    pub readahead: usize,
    /// First back-off after a member fails (default 1 s); doubles per failure up to
    /// `max_backoff` (default 30 s); failures of requests already in flight while it is backed
    /// off count as the same one. While backed off, requests skip the member without waiting.
    pub min_backoff: Duration,
    /// Longest back-off.
    pub max_backoff: Duration,
    /// With [`ClusterSource::Addr`]: how often the member list is asked again from a member
    /// (default 5 s; zero: never, only when a member says it does not own a key).
    pub membership_refresh: Duration,
    /// With [`ClusterSource::Etcd`]: credentials and TLS settings for etcd; `None` takes
    /// them from the `PAGESTORE_ETCD_*` environment variables ([`EtcdOptions::from_env`]).
    pub etcd: Option<EtcdOptions>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            fallback: true,
            call_timeout: Duration::from_secs(3),
            min_silence: Duration::from_millis(200),
            store_timeout: Duration::from_secs(60),
            hedge_min: Duration::from_millis(20),
            hedge_ratio: 0.05,
            hedge_burst: 10,
            parallel: 8,
            readahead: 4,
            min_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            membership_refresh: Duration::from_secs(5),
            etcd: None,
        }
    }
}

/// The client's counters (all monotonic).
#[derive(Debug, Default)]
pub struct ClientStats {
    /// Page requests answered by the owning shard.
    pub owner_reads: AtomicU64,
    /// Page requests answered by a replica.
    pub replica_reads: AtomicU64,
    /// Page requests of hot pages answered by one of their replicas (spread by the owner's
    /// word), not counted in `replica_reads`.
    pub hot_reads: AtomicU64,
    /// Page reads served straight from the under storage because the cluster could not.
    pub fallbacks: AtomicU64,
    /// Metadata requests (stat, list) served straight from the under storage.
    pub metadata_fallbacks: AtomicU64,
    /// Bytes received from shards.
    pub cluster_bytes: AtomicU64,
    /// Bytes read from the under storage directly.
    pub ufs_bytes: AtomicU64,
    /// Requests to a member that failed (timeouts, resets, errors that are not answers).
    pub member_failures: AtomicU64,
    /// Requests that skipped a member because it is backed off, or down in etcd.
    pub skipped_dead: AtomicU64,
    /// Requests given up before the call timeout because their member went silent (see
    /// [`ClientOptions::min_silence`]); each also counts in `member_failures`.
    pub silent_gives_up: AtomicU64,
    /// Requests that found their member gone when it went silent: its host refused a datagram
    /// to its port (nothing listens there), so the request was given up or hedged at once,
    /// without waiting out a ping (`Pool::port_refused`). Counted per request: the requests
    /// waiting on one member share its probe, and each counts its outcome.
    pub ports_refused: AtomicU64,
    /// Page requests hedged: asked of a second source because the first was late (see
    /// [`ClientOptions::hedge_min`]).
    pub hedges: AtomicU64,
    /// Hedges sent to the under storage (also counted in `hedges`; a won one also in
    /// `fallbacks`).
    pub store_hedges: AtomicU64,
    /// Hedges whose answer came first (the first request was cancelled).
    pub hedges_won: AtomicU64,
    /// Hedges not sent because the budget was spent ([`ClientOptions::hedge_ratio`]).
    pub hedges_refused: AtomicU64,
    /// Membership changes applied (from etcd, or from a member's list).
    pub ring_updates: AtomicU64,
    /// Page requests whose owner answered that its under storage failed (`Io`): no replica is
    /// asked then (it would read the same store again), only the fallback.
    pub store_errors: AtomicU64,
}

/// A snapshot of [`ClientStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// See [`ClientStats::owner_reads`].
    pub owner_reads: u64,
    /// See [`ClientStats::replica_reads`].
    pub replica_reads: u64,
    /// See [`ClientStats::hot_reads`].
    pub hot_reads: u64,
    /// See [`ClientStats::fallbacks`].
    pub fallbacks: u64,
    /// See [`ClientStats::metadata_fallbacks`].
    pub metadata_fallbacks: u64,
    /// See [`ClientStats::cluster_bytes`].
    pub cluster_bytes: u64,
    /// See [`ClientStats::ufs_bytes`].
    pub ufs_bytes: u64,
    /// See [`ClientStats::member_failures`].
    pub member_failures: u64,
    /// See [`ClientStats::skipped_dead`].
    pub skipped_dead: u64,
    /// See [`ClientStats::silent_gives_up`].
    pub silent_gives_up: u64,
    /// See [`ClientStats::ports_refused`].
    pub ports_refused: u64,
    /// See [`ClientStats::store_errors`].
    pub store_errors: u64,
    /// See [`ClientStats::hedges`].
    pub hedges: u64,
    /// See [`ClientStats::store_hedges`].
    pub store_hedges: u64,
    /// See [`ClientStats::hedges_won`].
    pub hedges_won: u64,
    /// See [`ClientStats::hedges_refused`].
    pub hedges_refused: u64,
    /// See [`ClientStats::ring_updates`].
    pub ring_updates: u64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

#[derive(Debug)]
struct Health {
    dead_until: Instant,
    backoff: Duration,
    probing: bool,
}

/// The cluster as the client sees it. Replaced whole when membership changes (etcd), so a
/// request works with one consistent view.
pub(crate) struct Layout {
    pub(crate) membership: Arc<Membership>,
    /// Ring members known to be down (static ring mode): their keys go to a replica or the
    /// under storage without waiting for a timeout.
    pub(crate) down: HashSet<u128>,
    pub(crate) page_size: u32,
    pub(crate) replicas: u8,
    /// Write replicas of write-back files as the cluster is configured (`--write-replicas`).
    pub(crate) write_setting: u8,
    pub(crate) mounts: Vec<MountEntry>,
}

impl Layout {
    /// Write replicas of write-back files in force: the setting, at most the ring's nodes, at
    /// least 1 (so a client that connected while nodes were still joining writes as many
    /// copies as the cluster it now sees can hold).
    pub(crate) fn write_replicas(&self) -> u8 {
        let r = effective_replicas(self.write_setting, self.membership.nodes().count());
        u8::try_from(r).unwrap_or(u8::MAX)
    }
}

/// A client of one cluster. Cheap to share: wrap it in an `Arc` (file handles need one).
pub struct Client {
    pool: Arc<Pool>,
    layout: RwLock<Arc<Layout>>,
    etcd: Option<Arc<Etcd>>,
    /// Wakes the task that asks a member for the member list again (address sources).
    refresh: Option<Arc<tokio::sync::Notify>>,
    ufs: Option<Arc<MountTable>>,
    health: Mutex<HashMap<SocketAddr, Health>>,
    /// Each member's usual answer time and last answer (members that answered at least once).
    timing: Mutex<HashMap<SocketAddr, Latency>>,
    stats: ClientStats,
    options: ClientOptions,
    next_id: AtomicU64,
    /// Pages owners said are hot: their reads are spread over their replicas.
    hot: HotMap,
    /// How many page requests may still be hedged.
    hedge_budget: HedgeBudget,
    /// Members a watcher is settling (after a hedge beat a request to them: see
    /// [`Client::settle`]).
    settling: Mutex<HashSet<SocketAddr>>,
    /// Port probes of members sent before any member answered this client (see
    /// [`Client::refused_since`]).
    fresh_probes: Mutex<FreshProbes>,
    /// Woken when a probe of [`Client::fresh_probes`] ends.
    probe_done: tokio::sync::Notify,
    /// This client, for the watchers it spawns.
    me: Weak<Client>,
}

/// One shard's occupancy and hit counts, as `Stat` reports them (the fuller
/// [`ShardCounters`] come from [`Client::shard_counters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardStat {
    /// Pages cached.
    pub pages: u64,
    /// Bytes cached.
    pub bytes: u64,
    /// Capacity in bytes.
    pub capacity_bytes: u64,
    /// Read hits since the shard started.
    pub hits: u64,
    /// Read misses since the shard started.
    pub misses: u64,
}

/// What [`Client::load`] did for one file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadOutcome {
    /// Pages loaded from the under storage now.
    pub loaded: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Pages that were cached already (skipped).
    pub present: u64,
}

/// Outcome of one request to one member.
pub(crate) enum Attempt<T> {
    /// An answer (data or a definite error such as NotFound).
    Answer(Result<T, Error>),
    /// The member could not answer; try elsewhere. Why, for messages.
    Failed(String),
    /// The member is up and tried the under storage, which failed (`Io`): another member
    /// would only read the same store again.
    StoreFailed(String),
    /// The member holds the write-back page only as it recovered it (`Unverified`): another
    /// write member may hold newer bytes. Elsewhere the same as `Failed`.
    Unverified(String),
}

impl<T> Attempt<T> {
    /// The answer, or [`Error::Unavailable`] with why the member could not give one.
    fn into_result(self) -> Result<T, Error> {
        match self {
            Attempt::Answer(r) => r,
            Attempt::Failed(why) | Attempt::StoreFailed(why) | Attempt::Unverified(why) => {
                Err(Error::unavailable(why))
            }
        }
    }
}

/// `message` without `suffix` at its end.
fn without(message: &str, suffix: &str) -> String {
    message.strip_suffix(suffix).unwrap_or(message).to_string()
}

/// A probe of a backed-off member in flight ([`Client::usable`]): dropped before its outcome
/// is known (the request was cancelled), it lets the next request probe instead.
struct ProbeGuard<'a> {
    client: &'a Client,
    addr: SocketAddr,
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        let mut h = self.client.health.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = h.get_mut(&self.addr) {
            s.probing = false;
        }
    }
}

/// Port probes sent before any member answered a client ([`Client::refused_since`]).
#[derive(Default)]
struct FreshProbes {
    /// Members being probed now.
    running: HashSet<SocketAddr>,
    /// When each member's port was last found refused.
    refused: HashMap<SocketAddr, Instant>,
}

/// A probe of `addr` under way ([`FreshProbes::running`]) until dropped, even mid-probe
/// (the request it waited for was answered or cancelled): another request probes then.
struct FreshProbe<'a> {
    client: &'a Client,
    addr: SocketAddr,
}

impl Drop for FreshProbe<'_> {
    fn drop(&mut self) {
        let mut p = self
            .client
            .fresh_probes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        p.running.remove(&self.addr);
        drop(p);
        self.client.probe_done.notify_waiters();
    }
}

/// The position in `membership`'s node list of the node whose shard listens at `addr`.
fn node_of(membership: &Membership, addr: SocketAddr) -> Option<usize> {
    membership.nodes().position(|n| {
        n.addr.ip() == addr.ip()
            && (n.addr.port()..n.addr.port().saturating_add(n.shards)).contains(&addr.port())
    })
}

/// What pinging a member that seems silent says of it ([`Client::ping_verdict`]).
enum Verdict {
    Alive,
    Silent,
    /// Silent to a ping given the call timeout, with no member of another node to compare.
    SilentAlone,
    /// Nothing listens at its address any more ([`Pool::port_refused`]): the process is gone.
    Gone,
    Unknown,
}

/// The page a read is after, for judging its answers.
struct PageRead<'a> {
    info: &'a ObjectInfo,
    page: u64,
    /// Members the page is spread over (hot), as the read found it.
    spread: usize,
    /// A file written through the cluster.
    written: bool,
    now: Instant,
    /// Members that answered `Unverified`: asked again with [`Route::Recovered`] if no other
    /// member holds the page.
    unverified: std::sync::Mutex<Vec<SocketAddr>>,
    /// A write member's `Changed` (see [`Client::judge`]): the answer if no member serves
    /// the page.
    changed: std::sync::Mutex<Option<Error>>,
}

/// Where a read goes after an answer.
enum Step {
    /// The read's result.
    Done(Result<Bytes, Error>),
    /// The next member.
    Next,
    /// The under storage, skipping the members left (they would read the same store).
    ToStore,
}

/// Where a late page request is hedged.
#[derive(Clone, Copy)]
enum HedgeTarget {
    /// The next member of the page; `holds`: it holds the page too (no store read).
    Member {
        index: usize,
        addr: SocketAddr,
        holds: bool,
    },
    /// The under storage (no member left).
    Store,
}

/// A hedge's answer.
enum HedgeDone {
    Member(Route, SocketAddr, Attempt<(ResponseBody, Bytes)>),
    Store(Result<Bytes, Error>),
}

/// How a hedged `StatPath` ended when it did not end with the member's answer alone.
enum HedgedStat {
    /// The store answered first (or after the member failed): the result.
    Store(Result<PathKind, Error>),
    /// The store failed (it is not asked again), and what the member did.
    StoreFailed(Error, Attempt<(ResponseBody, Bytes)>),
}

/// A stat's hedge in flight.
type StatFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<PathKind, Error>> + Send + 'a>>;

/// A hedge in flight (boxed: only hedged reads pay for it).
type HedgeFuture<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = HedgeDone> + Send + 'a>>;

impl Client {
    /// Connects to a cluster: reads the member list (from the file, or from the member at the
    /// address), asks a member for the page size and mounts, and opens the under storage for
    /// fallback. `ufs`: the mount table to fall back to; `None` builds one from the cluster's
    /// mounts (credentials for S3 mounts then come from the `AWS_*` environment variables).
    /// Must be called inside a tokio runtime.
    pub async fn connect(
        source: &ClusterSource,
        tls: quinn::ClientConfig,
        ufs: Option<Arc<MountTable>>,
        options: ClientOptions,
    ) -> Result<Arc<Client>, Error> {
        let (listed, probe, followed) = resolve_source(source, &options).await?;
        let pool = Pool::new(
            tls,
            local_bind(&probe)?,
            PoolOptions {
                timeout: options.call_timeout,
                ..PoolOptions::default()
            },
        )
        .map_err(|e| Error::config_from(format!("cannot open a UDP socket: {e}"), e))?;
        let ClusterAnswer {
            page_size,
            epoch: member_epoch,
            replicas,
            write_replicas,
            nodes,
            mounts,
        } = ask_cluster(&pool, &probe).await?;
        if page_size == 0 {
            return Err(Error::config("the cluster reports a page size of 0"));
        }
        let from_member = listed.is_none();
        let nodes = match listed {
            Some(n) => n,
            None => node_infos(&nodes)?,
        };
        let epoch = match (&followed, from_member) {
            (Some((_, s)), _) => s.revision.max(1),
            (None, true) => member_epoch.max(1),
            (None, false) => 1,
        };
        let down = followed
            .as_ref()
            .map_or_else(HashSet::new, |(_, s)| s.down().into_iter().collect());
        let membership = Membership::new(nodes, RingConfig::default(), epoch)
            .map_err(|e| Error::config_from(e.to_string(), e))?;
        let ufs = match ufs {
            Some(u) => Some(u),
            None if options.fallback => fallback_table(&mounts),
            None => None,
        };
        let hedge_budget = HedgeBudget::new(options.hedge_ratio, options.hedge_burst);
        let client = Arc::new_cyclic(|me| Client {
            pool,
            layout: RwLock::new(Arc::new(Layout {
                membership: Arc::new(membership),
                down,
                page_size,
                replicas,
                write_setting: write_replicas,
                mounts,
            })),
            etcd: followed.as_ref().map(|(e, _)| e.clone()),
            refresh: from_member.then(|| Arc::new(tokio::sync::Notify::new())),
            ufs,
            health: Mutex::new(HashMap::new()),
            timing: Mutex::new(HashMap::new()),
            stats: ClientStats::default(),
            options,
            next_id: AtomicU64::new(2),
            hot: HotMap::default(),
            hedge_budget,
            settling: Mutex::new(HashSet::new()),
            fresh_probes: Mutex::new(FreshProbes::default()),
            probe_done: tokio::sync::Notify::new(),
            me: me.clone(),
        });
        if let Some((etcd, state)) = followed {
            let weak = Arc::downgrade(&client);
            crate::etcd::follow(etcd, Some(state), move |s| match weak.upgrade() {
                Some(c) => {
                    c.apply(s);
                    true
                }
                None => false,
            });
        }
        if let (Some(wake), Some(seed)) = (&client.refresh, probe.first()) {
            follow_members(
                Arc::downgrade(&client),
                wake.clone(),
                client.options.membership_refresh,
                *seed,
            );
        }
        Ok(client)
    }

    /// Asks a member for the member list (a `Cluster` request) and routes by it when it
    /// differs from the one in force. Members are asked in turn, starting after the last one
    /// asked; `seed` (the address the client was given) last. Answers from a member whose
    /// ring is older than ours are ignored.
    async fn refresh_members(&self, seed: SocketAddr, turn: usize) {
        let layout = self.layout();
        let mut candidates: Vec<SocketAddr> = layout
            .membership
            .nodes()
            .filter(|n| !layout.down.contains(&n.id))
            .map(|n| n.addr)
            .collect();
        if !candidates.is_empty() {
            let k = turn % candidates.len();
            candidates.rotate_left(k);
        }
        if !candidates.contains(&seed) {
            candidates.push(seed);
        }
        let now = Instant::now();
        let backed_off = |a: &SocketAddr| {
            self.health
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(a)
                .is_some_and(|h| h.dead_until > now)
        };
        let current = layout.membership.ring().epoch();
        for addr in candidates.iter().filter(|a| !backed_off(a)) {
            let req = Request {
                request_id: self.next_id.fetch_add(1, Ordering::Relaxed),
                body: RequestBody::Cluster,
            };
            let (epoch, nodes, mounts) = match self.pool.request(*addr, &req, Bytes::new()).await {
                Ok((resp, _)) => match resp.body {
                    ResponseBody::ClusterInfo {
                        epoch,
                        nodes,
                        mounts,
                        ..
                    } => (epoch, nodes, mounts),
                    _ => continue,
                },
                Err(e) => {
                    tracing::debug!(%addr, error = %e, "member list: no answer");
                    continue;
                }
            };
            if epoch < current {
                tracing::debug!(%addr, epoch, current, "member list: that member is behind");
                continue;
            }
            let nodes = match node_infos(&nodes) {
                Ok(n) if !n.is_empty() => n,
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(%addr, error = %e, "ignoring a malformed member list");
                    continue;
                }
            };
            let mut now_ids: Vec<NodeInfo> = layout.membership.nodes().copied().collect();
            let mut new_ids = nodes.clone();
            now_ids.sort_by_key(|n| n.id);
            new_ids.sort_by_key(|n| n.id);
            if now_ids == new_ids {
                if mounts != layout.mounts {
                    let mut guard = self.layout.write().unwrap_or_else(|p| p.into_inner());
                    let old = guard.clone();
                    *guard = Arc::new(Layout {
                        membership: old.membership.clone(),
                        down: old.down.clone(),
                        page_size: old.page_size,
                        replicas: old.replicas,
                        write_setting: old.write_setting,
                        mounts,
                    });
                }
                return;
            }
            match Membership::new(nodes, RingConfig::default(), epoch.max(1)) {
                Ok(m) => self.install(m, HashSet::new(), Some(mounts), "a member's list"),
                Err(e) => tracing::warn!(%addr, error = %e, "ignoring a member list"),
            }
            return;
        }
    }

    /// Routes by a new membership state from etcd.
    fn apply(&self, s: &ClusterState) {
        let membership =
            match Membership::new(s.ring_nodes(), RingConfig::default(), s.revision.max(1)) {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "ignoring a membership change");
                    return;
                }
            };
        let down: HashSet<u128> = s.down().into_iter().collect();
        self.install(membership, down, None, s.mode().as_str());
    }

    /// Routes by `membership` from now on. `mounts`: the cluster's mount table, when the new
    /// view brings one. `from`: where the view comes from, for the log.
    fn install(
        &self,
        membership: Membership,
        down: HashSet<u128>,
        mounts: Option<Vec<MountEntry>>,
        from: &str,
    ) {
        let was_down = self
            .layout
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .down
            .clone();
        let old_down = |id: u128| was_down.contains(&id);
        {
            // Members that are (back) up in etcd get a fresh chance at once, on a fresh
            // connection (the old one may lead to the process that died).
            let mut health = self.health.lock().unwrap_or_else(|p| p.into_inner());
            for n in membership.nodes().filter(|n| !down.contains(&n.id)) {
                for shard in 0..n.shards {
                    if health.remove(&n.shard_addr(shard)).is_some() || old_down(n.id) {
                        self.pool.forget(n.shard_addr(shard));
                    }
                }
            }
        }
        let mut guard = self.layout.write().unwrap_or_else(|p| p.into_inner());
        let old = guard.clone();
        tracing::info!(
            epoch = membership.ring().epoch(),
            nodes = membership.nodes().count(),
            down = down.len(),
            from,
            "membership changed"
        );
        *guard = Arc::new(Layout {
            membership: Arc::new(membership),
            down,
            page_size: old.page_size,
            replicas: old.replicas,
            write_setting: old.write_setting,
            mounts: mounts.unwrap_or_else(|| old.mounts.clone()),
        });
        bump(&self.stats.ring_updates, 1);
    }

    pub(crate) fn layout(&self) -> Arc<Layout> {
        self.layout
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The cluster's page size.
    pub fn page_size(&self) -> u32 {
        self.layout().page_size
    }

    /// The cluster's mount table (credentials removed).
    pub fn mounts(&self) -> Vec<MountEntry> {
        self.layout().mounts.clone()
    }

    /// The member list and ring in force now.
    pub fn membership(&self) -> Arc<Membership> {
        self.layout().membership.clone()
    }

    /// Ring members that etcd reports down (static ring mode).
    pub fn down_members(&self) -> Vec<u128> {
        let mut v: Vec<u128> = self.layout().down.iter().copied().collect();
        v.sort_unstable();
        v
    }

    /// The etcd connection, when the client follows membership in etcd.
    pub fn etcd(&self) -> Option<&Arc<Etcd>> {
        self.etcd.as_ref()
    }

    /// The options in force.
    pub fn options(&self) -> &ClientOptions {
        &self.options
    }

    /// The counters.
    pub fn stats(&self) -> StatsSnapshot {
        let s = &self.stats;
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            owner_reads: g(&s.owner_reads),
            replica_reads: g(&s.replica_reads),
            hot_reads: g(&s.hot_reads),
            fallbacks: g(&s.fallbacks),
            metadata_fallbacks: g(&s.metadata_fallbacks),
            cluster_bytes: g(&s.cluster_bytes),
            ufs_bytes: g(&s.ufs_bytes),
            member_failures: g(&s.member_failures),
            skipped_dead: g(&s.skipped_dead),
            ring_updates: g(&s.ring_updates),
            silent_gives_up: g(&s.silent_gives_up),
            ports_refused: g(&s.ports_refused),
            store_errors: g(&s.store_errors),
            hedges: g(&s.hedges),
            store_hedges: g(&s.store_hedges),
            hedges_won: g(&s.hedges_won),
            hedges_refused: g(&s.hedges_refused),
        }
    }

    /// Whether a request may go to `addr` now: not backed off (`Some(None)`), or the one probe
    /// allowed after the back-off ran out (`Some(Some(guard))`: the guard lets another request
    /// probe if this one is dropped before its outcome is known, as a hedged request may be).
    fn usable(&self, addr: SocketAddr) -> Option<Option<ProbeGuard<'_>>> {
        let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        match h.get_mut(&addr) {
            None => Some(None),
            Some(s) if !s.probing && Instant::now() >= s.dead_until => {
                s.probing = true;
                Some(Some(ProbeGuard { client: self, addr }))
            }
            Some(_) => {
                bump(&self.stats.skipped_dead, 1);
                None
            }
        }
    }

    fn succeeded(&self, addr: SocketAddr) {
        let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        if h.remove(&addr).is_some() {
            tracing::info!(%addr, "member answers again");
        }
    }

    fn failed(&self, addr: SocketAddr, why: &str) {
        bump(&self.stats.member_failures, 1);
        let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        let (min, max) = (self.options.min_backoff, self.options.max_backoff);
        let e = h.entry(addr).or_insert(Health {
            dead_until: Instant::now(),
            backoff: Duration::ZERO,
            probing: false,
        });
        let now = Instant::now();
        // Requests that were in flight when the member failed fail too: one episode, one
        // back-off. It doubles only when the member fails again after its back-off ran out
        // (the probe failed), so that a moment of overload does not bar a live member for
        // the longest back-off.
        if now < e.dead_until && !e.probing {
            tracing::debug!(%addr, why, "member failed again while backed off");
            return;
        }
        e.backoff = (e.backoff * 2).clamp(min, max);
        e.dead_until = now + e.backoff;
        e.probing = false;
        tracing::warn!(%addr, backoff = ?e.backoff, why, "member failed; backing off");
    }

    /// Records an answer from `addr` to a request sent at `sent`.
    fn answered(&self, addr: SocketAddr, sent: Instant) {
        let now = Instant::now();
        let took = now.saturating_duration_since(sent);
        let mut t = self.timing.lock().unwrap_or_else(|p| p.into_inner());
        t.entry(addr)
            .and_modify(|l| l.record(took, now))
            .or_insert_with(|| Latency::new(took, now));
    }

    /// Resolves when the request sent to `addr` at `sent` should be given up: `addr` has
    /// answered nothing for its silence limit, and does not answer a `Ping` within it either (a
    /// request that is merely slow, such as a page its shard loads from a distant store, is
    /// waited for as long as the member answers pings). A member that has not answered this
    /// client yet is judged by the slowest usual answer time of those that have (the ping then
    /// also has to reach it: a live member answers it after its handshake, a stopped one does
    /// not). Before any member answered, there is nothing to judge silence by: once the
    /// request has waited the silence floor, a member of another node is pinged
    /// ([`Client::stranger_answers`]) and, once it answers, the request is judged by its
    /// answer times (a fresh client whose first requests queue behind loads from a slow store
    /// keeps them, since their member answers pings; one whose member answers nothing, not
    /// even its handshake, leaves it within a second); meanwhile, the member's host refusing a
    /// datagram to its port ends it at once (the process is gone: a lone node has no other
    /// node to compare with); with no answer from anyone, it is given up at the call timeout.
    /// Returns why, for the log: `Ok` when the member was judged silent or gone, `Err` when no
    /// member had answered within the call timeout.
    async fn silence(&self, addr: SocketAddr, sent: Instant) -> Result<String, String> {
        let (floor, ceiling) = (self.options.min_silence, self.options.call_timeout);
        loop {
            let Some((l, _)) = self.latency_of(addr) else {
                let at = sent + ceiling;
                if Instant::now() < at {
                    // A member whose process is gone is told by its port even so, once the
                    // request has waited the silence floor: only that ends the wait early.
                    // Nor is a member of another node asked to answer a ping until then: once
                    // one has, its answer times judge this member's silence (a host gone as a
                    // whole, or one whose network drops datagrams silently, refuses nothing).
                    tokio::select! {
                        true = self.refused_since(addr, sent + floor, at) => {
                            bump(&self.stats.ports_refused, 1);
                            return Ok(format!(
                                "no answer for {floor:?}, and its host refuses datagrams to its \
                                 port (nothing listens there: the process is gone; no member \
                                 has answered this client yet)"
                            ));
                        }
                        true = self.stranger_answers(addr, sent + floor, at) => {}
                        () = tokio::time::sleep_until(at.into()) => {}
                    }
                    continue;
                }
                return Err(format!(
                    "no reply from {addr} within {ceiling:?}, and no member has answered this \
                     client yet"
                ));
            };
            let at = l.give_up_at(sent, floor, ceiling);
            if Instant::now() < at {
                tokio::time::sleep_until(at.into()).await;
                continue;
            }
            let limit = l.silence_limit(floor, ceiling);
            let asked = Instant::now();
            let alone = match self.ping_verdict(addr, limit).await {
                Verdict::Alive | Verdict::Unknown => continue,
                Verdict::Silent => false,
                Verdict::SilentAlone => true,
                Verdict::Gone => {
                    // Given up when a missed ping would have given it up (a lone member's
                    // ping is otherwise given the call timeout): a hedge sent meanwhile keeps
                    // as long to answer first.
                    tokio::time::sleep_until((asked + limit).into()).await;
                    return Ok(format!(
                        "no answer for {limit:?}, and its host refuses datagrams to its port \
                         (nothing listens there: the process is gone)"
                    ));
                }
            };
            if alone {
                return Ok(format!(
                    "no answer, not even to a ping within {ceiling:?} (no member of another \
                     node to compare with; it usually answers within {:?})",
                    l.usual()
                ));
            }
            return Ok(format!(
                "no answer for {limit:?}, not even to a ping that a member of another node \
                 answered (it usually answers within {:?})",
                l.usual()
            ));
        }
    }

    /// Resolves `true` once `addr`'s host refused a port probe sent at `from` or later, `false`
    /// if none did by `until`. One probe per member at a time: the requests waiting on a
    /// member share its outcome (a fresh client's first burst, queued behind loads from a slow
    /// store, would otherwise hold a socket per request).
    async fn refused_since(&self, addr: SocketAddr, from: Instant, until: Instant) -> bool {
        tokio::time::sleep_until(from.into()).await;
        loop {
            // Registered before the state is read, so that a probe ending in between wakes it.
            let done = self.probe_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            let mine = {
                let mut p = self.fresh_probes.lock().unwrap_or_else(|e| e.into_inner());
                if p.refused.get(&addr).is_some_and(|at| *at >= from) {
                    return true;
                }
                p.running.insert(addr)
            };
            if mine {
                let _running = FreshProbe { client: self, addr };
                let refused = self
                    .pool
                    .port_refused(addr, until.saturating_duration_since(Instant::now()))
                    .await;
                if refused {
                    let mut p = self.fresh_probes.lock().unwrap_or_else(|e| e.into_inner());
                    p.refused.insert(addr, Instant::now());
                }
                return refused;
            }
            tokio::select! {
                () = done => {}
                () = tokio::time::sleep_until(until.into()) => return false,
            }
        }
    }

    /// Pings `addr` and, as a control, a member of another node ([`Client::control_member`])
    /// at the same time, each for `wait`. [`Verdict::Alive`]: `addr` answered the ping or
    /// anything else meanwhile, or bytes kept arriving on this client's connection to it.
    /// [`Verdict::Silent`]: it did not, and the control did. Otherwise [`Verdict::Unknown`]:
    /// this client or its machine is starved of CPU (every member then looks silent), or every
    /// node is gone at once; no member is judged on that. With no other node to ask, the ping
    /// alone decides ([`Verdict::SilentAlone`]), and it is given the call timeout (`wait` at
    /// least): a lone node busy on its machine's every core (a gateway, its readers and the
    /// node on one host) misses a ping of a few hundred milliseconds, and backing off the only
    /// node fails every request until the back-off ends, where waiting longer costs only the
    /// time to notice a dead one.
    async fn ping_verdict(&self, addr: SocketAddr, wait: Duration) -> Verdict {
        let asked = Instant::now();
        let received = self.pool.received(addr);
        let control = self.control_member(addr);
        let wait = match control {
            Some(_) => wait,
            None => wait.max(self.options.call_timeout),
        };
        let pings = async {
            tokio::join!(self.pings(addr, wait), async {
                match control {
                    Some(c) => self.pings(c, wait).await,
                    None => true,
                }
            })
        };
        // A member whose process is gone is told from one that is stopped or starved without
        // waiting out the ping: its host refuses a datagram to its port.
        let (alive, control_alive) = tokio::select! {
            true = self.pool.port_refused(addr, wait) => {
                self.missed_ping(addr, asked);
                bump(&self.stats.ports_refused, 1);
                return Verdict::Gone;
            }
            answers = pings => answers,
        };
        // A member busy sending this client a backlog of large answers may complete none of
        // them, nor the ping queued behind them on the same connection, for a while: bytes
        // still arriving from it say it is alive.
        let sending = matches!(
            (received, self.pool.received(addr)),
            (Some(before), Some(now)) if now > before
        );
        if alive
            || sending
            || matches!(self.latency_of(addr), Some((l, true)) if l.last_answer() > asked)
        {
            Verdict::Alive
        } else if control_alive {
            self.missed_ping(addr, asked);
            if control.is_some() {
                Verdict::Silent
            } else {
                Verdict::SilentAlone
            }
        } else {
            Verdict::Unknown
        }
    }

    /// The answer times a request to `addr` is judged by, and whether they are its own: its
    /// own once it has answered this client, else the slowest of the members that have; `None`
    /// before any has.
    fn latency_of(&self, addr: SocketAddr) -> Option<(Latency, bool)> {
        let t = self.timing.lock().unwrap_or_else(|p| p.into_inner());
        match t.get(&addr) {
            Some(l) => Some((*l, true)),
            None => t.values().max_by_key(|l| l.usual()).map(|l| (*l, false)),
        }
    }

    /// From `from` on, pings a member of another node than `addr`'s that this client has not
    /// backed off (the first shard of each such node in turn, starting after `addr`'s in the
    /// member list), until one answers (`true`: answer times now exist to judge `addr` by) or
    /// `until` passes or every such node failed to (`false`). How a client that no member has
    /// answered yet tells a member that answers nothing, not even its handshake, from its own
    /// slowness: a stopped process, a host gone as a whole, a network that drops datagrams
    /// without a word.
    async fn stranger_answers(&self, addr: SocketAddr, from: Instant, until: Instant) -> bool {
        tokio::time::sleep_until(from.into()).await;
        for stranger in self.strangers(addr) {
            if self.latency_of(addr).is_some() {
                return true;
            }
            let wait = until.saturating_duration_since(Instant::now());
            if wait.is_zero() {
                break;
            }
            if self.pings(stranger, wait).await {
                return true;
            }
        }
        false
    }

    /// The first shard of each node other than `addr`'s that this client has not backed off,
    /// starting with the next one after `addr`'s in the member list.
    fn strangers(&self, addr: SocketAddr) -> Vec<SocketAddr> {
        let layout = self.layout();
        let nodes: Vec<SocketAddr> = layout.membership.nodes().map(|n| n.addr).collect();
        let mine = node_of(&layout.membership, addr);
        let start = mine.map_or(0, |i| i + 1);
        let now = Instant::now();
        let h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        (0..nodes.len())
            .map(|k| (start + k) % nodes.len())
            .filter(|&i| Some(i) != mine)
            .map(|i| nodes[i])
            .filter(|a| h.get(a).is_none_or(|s| now >= s.dead_until))
            .collect()
    }

    /// `addr` did not answer a ping sent at `at` in time.
    fn missed_ping(&self, addr: SocketAddr, at: Instant) {
        let mut t = self.timing.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = t.get_mut(&addr) {
            l.missed_ping(at);
        }
    }

    /// Whether `addr` answers a `Ping` within `limit` (an answer counts as one in its timing).
    async fn pings(&self, addr: SocketAddr, limit: Duration) -> bool {
        let nonce = self.next_id.fetch_add(1, Ordering::Relaxed);
        let req = Request {
            request_id: nonce,
            body: RequestBody::Ping { nonce },
        };
        let sent = Instant::now();
        match tokio::time::timeout(limit, self.pool.request(addr, &req, Bytes::new())).await {
            Ok(Ok((resp, _))) if matches!(resp.body, ResponseBody::Pong { nonce: n } if n == nonce) =>
            {
                self.answered(addr, sent);
                true
            }
            _ => false,
        }
    }

    /// Sends `body` to `addr` and classifies the outcome.
    async fn ask(&self, addr: SocketAddr, body: RequestBody) -> Attempt<(ResponseBody, Bytes)> {
        self.ask_with(addr, body, Bytes::new()).await
    }

    /// [`Client::ask`] with a payload.
    pub(crate) async fn ask_with(
        &self,
        addr: SocketAddr,
        body: RequestBody,
        payload: Bytes,
    ) -> Attempt<(ResponseBody, Bytes)> {
        let Some(probe) = self.usable(addr) else {
            return Attempt::Failed(format!("{addr} is backed off after failures"));
        };
        self.ask_now(addr, body, payload, probe).await
    }

    /// [`Client::ask_with`] to a member even while it is backed off after failures: for a
    /// change that no other member took, where one more try costs at most a call timeout.
    pub(crate) async fn ask_despite_backoff(
        &self,
        addr: SocketAddr,
        body: RequestBody,
        payload: Bytes,
    ) -> Attempt<(ResponseBody, Bytes)> {
        self.ask_now(addr, body, payload, None).await
    }

    /// Sends `body` to `addr` (`probe`: held while this is the one request that probes a
    /// member after its back-off) and classifies the outcome.
    async fn ask_now(
        &self,
        addr: SocketAddr,
        body: RequestBody,
        payload: Bytes,
        probe: Option<ProbeGuard<'_>>,
    ) -> Attempt<(ResponseBody, Bytes)> {
        let hot = matches!(
            body,
            RequestBody::Fetch {
                route: Route::Hot,
                ..
            }
        );
        let req = Request {
            request_id: self.next_id.fetch_add(1, Ordering::Relaxed),
            body,
        };
        let sent = Instant::now();
        // What waits on the store may take long (a slow store, a queue of loads): its liveness
        // is the silence rule's, which needs some member's answer times to judge by (until a
        // member has answered, the call timeout tells a dead member: `silence`).
        let timeout = match &req.body {
            RequestBody::Fetch { .. } | RequestBody::StatPath { .. } | RequestBody::List { .. } => {
                self.options.store_timeout.max(self.options.call_timeout)
            }
            _ => self.options.call_timeout,
        };
        let reply = tokio::select! {
                r = self.pool.request_within(addr, &req, payload, timeout) => r,
                why = self.silence(addr, sent) => {
                    let why = match why {
                        Ok(silent) => {
                            bump(&self.stats.silent_gives_up, 1);
                            silent
                        }
                        Err(timed_out) => timed_out,
                    };
                    // Its connection may lead to a process that is gone: connect afresh next
                    // time.
                    self.pool.forget(addr);
                    self.failed(addr, &why);
                    std::mem::forget(probe);
                    return Attempt::Failed(format!("{addr}: {why}"));
                }
        };
        // The outcome is known: `failed` or `succeeded` below ends the probe.
        std::mem::forget(probe);
        match reply {
            Err(e) => {
                self.failed(addr, &e.to_string());
                Attempt::Failed(format!("{addr}: {e}"))
            }
            Ok((resp, payload)) => {
                // Any answer means the member is alive.
                self.answered(addr, sent);
                self.succeeded(addr);
                match &resp.body {
                    ResponseBody::Error { code, message } => match code {
                        ErrorCode::NotFound => {
                            Attempt::Answer(Err(Error::NotFound(message.clone())))
                        }
                        ErrorCode::Changed => Attempt::Answer(Err(Error::Changed(message.clone()))),
                        ErrorCode::BadRange => {
                            Attempt::Answer(Err(Error::BadRange(message.clone())))
                        }
                        ErrorCode::BadRequest => {
                            Attempt::Answer(Err(Error::BadPath(message.clone())))
                        }
                        ErrorCode::Forbidden => {
                            Attempt::Answer(Err(Error::Forbidden(message.clone())))
                        }
                        ErrorCode::Exists => Attempt::Answer(Err(Error::Exists(message.clone()))),
                        ErrorCode::NotEmpty => {
                            Attempt::Answer(Err(Error::NotEmpty(message.clone())))
                        }
                        ErrorCode::Full => Attempt::Answer(Err(Error::NoSpace(message.clone()))),
                        // The errors' texts say "is a directory", "not a directory" again.
                        ErrorCode::IsDir => {
                            Attempt::Answer(Err(Error::IsDir(without(message, ": is a directory"))))
                        }
                        ErrorCode::NotDir => Attempt::Answer(Err(Error::NotDir(without(
                            message,
                            ": not a directory",
                        )))),
                        ErrorCode::Precondition => {
                            Attempt::Answer(Err(Error::Precondition(message.clone())))
                        }
                        ErrorCode::Unverified => Attempt::Unverified(format!("{addr}: {message}")),
                        ErrorCode::Io => {
                            tracing::debug!(%addr, message, "member's under storage failed");
                            Attempt::StoreFailed(format!("{addr}: {message}"))
                        }
                        // The shard is up but could not serve this (its disk, its store, load):
                        // try elsewhere without marking it dead.
                        _ => {
                            tracing::debug!(%addr, ?code, message, "member could not serve");
                            Attempt::Failed(format!("{addr}: {message}"))
                        }
                    },
                    // Our ring disagrees with the member's: serve elsewhere this time.
                    // A member that takes no hot reads (replicas off there) is not a sign of a
                    // stale ring.
                    ResponseBody::NotOwner { epoch } if hot => {
                        tracing::debug!(%addr, epoch, "member does not serve this hot page");
                        Attempt::Failed(format!("{addr} does not serve the hot page"))
                    }
                    ResponseBody::NotOwner { epoch } => {
                        tracing::warn!(%addr, epoch, "member says it is not the owner");
                        if let Some(wake) = &self.refresh {
                            wake.notify_one();
                        }
                        Attempt::Failed(format!("{addr} does not own the request's key"))
                    }
                    _ => Attempt::Answer(Ok((resp.body, payload))),
                }
            }
        }
    }

    /// Sends one request to the shard at `addr` and returns its answer (an error answer as the
    /// matching [`Error`]; [`Error::Unavailable`] when the member cannot be reached or could
    /// not serve it). For tools and for nodes talking to their peers.
    pub async fn call(
        &self,
        addr: SocketAddr,
        body: RequestBody,
        payload: Bytes,
    ) -> Result<(ResponseBody, Bytes), Error> {
        self.ask_with(addr, body, payload).await.into_result()
    }

    /// [`Client::call`] even while `addr` is backed off after failures: for a node that needs
    /// an answer of every peer it can get (the back-off may well outlast the peer's trouble).
    pub async fn call_despite_backoff(
        &self,
        addr: SocketAddr,
        body: RequestBody,
        payload: Bytes,
    ) -> Result<(ResponseBody, Bytes), Error> {
        self.ask_despite_backoff(addr, body, payload)
            .await
            .into_result()
    }

    /// Whether requests may go to `addr` now (it is not backed off after failures).
    pub fn reachable(&self, addr: SocketAddr) -> bool {
        let h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        h.get(&addr).is_none_or(|s| Instant::now() >= s.dead_until)
    }

    /// Where to ask about `path`: its metadata owner; for a path of a `back` or `transient`
    /// mount also the next members on other nodes (every node keeps the records of files
    /// written through the cluster, so any of them answers alike).
    fn metadata_members(&self, path: &str) -> Vec<SocketAddr> {
        if !self.write_policy(path).is_cached() {
            return self.metadata_owner(path).into_iter().collect();
        }
        let layout = self.layout();
        let ring = layout.membership.ring();
        ring.replicas_of_hash(path_hash(path), 3)
            .into_iter()
            .filter(|m| !layout.down.contains(&m.node))
            .filter_map(|m| layout.membership.addr_of(m))
            .collect()
    }

    /// How the mount of `path` takes writes, as the cluster's mount table says (`through` for
    /// a path no mount holds).
    pub fn write_policy(&self, path: &str) -> WritePolicy {
        let layout = self.layout();
        mount_entry(&layout.mounts, path)
            .and_then(|m| WritePolicy::of_url(&m.url).ok())
            .unwrap_or_default()
    }

    /// The write replicas of files written through the cluster (at least 1).
    pub fn write_replicas(&self) -> u8 {
        self.layout().write_replicas()
    }

    fn metadata_owner(&self, path: &str) -> Option<SocketAddr> {
        let layout = self.layout();
        let m = layout.membership.ring().owner_of_hash(path_hash(path))?;
        if layout.down.contains(&m.node) {
            bump(&self.stats.skipped_dead, 1);
            return None;
        }
        layout.membership.addr_of(m)
    }

    fn ufs(&self) -> Result<&MountTable, Error> {
        if !self.options.fallback {
            return Err(Error::unavailable(
                "the owning member cannot be reached and fallback is off",
            ));
        }
        self.ufs.as_deref().ok_or_else(|| {
            Error::unavailable(
                "the owning member cannot be reached and no under storage is configured on this \
                 client for fallback",
            )
        })
    }

    /// What `path` names.
    pub async fn stat_path(&self, path: &str) -> Result<PathKind, Error> {
        check_path(path)?;
        let cached = self.write_policy(path).is_cached();
        // A path of a `through` mount has one metadata owner, whose silence would hold up
        // every reader opening the path: its stat is hedged to the store like a page (once
        // the owner is silent and misses a ping, within the budget). A file written through the
        // cluster is known to its members only: the next member is asked after a failure.
        let hedging = !cached
            && self.options.fallback
            && self.options.hedge_ratio > 0.0
            && self.ufs.is_some();
        if hedging {
            self.hedge_budget.earn();
        }
        // What the store answered a hedge, if it failed (not asked twice).
        let mut store_failed = None;
        for addr in self.metadata_members(path) {
            let body = RequestBody::StatPath { path: path.into() };
            let answer = if hedging {
                match self.stat_hedged(addr, body, path).await {
                    Ok(a) => a,
                    Err(HedgedStat::Store(r)) => return r,
                    Err(HedgedStat::StoreFailed(e, a)) => {
                        store_failed = Some(e);
                        a
                    }
                }
            } else {
                self.ask(addr, body).await
            };
            if let Attempt::Answer(r) = answer {
                return match r.map_err(|e| named(e, path))? {
                    (ResponseBody::PathInfo { kind }, _) => Ok(kind),
                    (other, _) => Err(Error::unavailable(format!("unexpected answer {other:?}"))),
                };
            }
        }
        if let Some(e) = store_failed {
            return Err(e);
        }
        if cached {
            return Err(Error::unavailable(format!(
                "{path}: no member answered, and files written through the cluster are known to its members only"
            )));
        }
        let ufs = self.ufs()?;
        bump(&self.stats.metadata_fallbacks, 1);
        Ok(ufs.stat_path(path).await?)
    }

    /// `StatPath` to `addr`, hedged to the store once `addr` is silent and misses a ping
    /// (within the budget): `Ok` with the member's outcome when the store did not answer for
    /// it, else how the store did ([`HedgedStat`]).
    async fn stat_hedged(
        &self,
        addr: SocketAddr,
        body: RequestBody,
        path: &str,
    ) -> Result<Attempt<(ResponseBody, Bytes)>, HedgedStat> {
        // The store's answer about the path (a file, a directory, none), as opposed to the
        // store failing.
        let answered = |r: &Result<PathKind, Error>| {
            !matches!(r, Err(Error::Unavailable { .. } | Error::Config { .. }))
        };
        let sent = Instant::now();
        let ask = self.ask(addr, body);
        let point = self.hedge_point(addr, sent, true);
        tokio::pin!(ask, point);
        let mut hedge: Option<StatFuture<'_>> = None;
        let mut hedged = false;
        let mut failed: Option<Error> = None;
        let answer = loop {
            tokio::select! {
                a = &mut ask => break a,
                Some(r) = OptionFuture::from(hedge.as_mut()), if hedge.is_some() => {
                    hedge = None;
                    if answered(&r) {
                        bump(&self.stats.hedges_won, 1);
                        bump(&self.stats.metadata_fallbacks, 1);
                        self.settle_later(addr, sent);
                        return Err(HedgedStat::Store(r));
                    }
                    failed = r.err();
                }
                () = &mut point, if !hedged => {
                    hedged = true;
                    if !self.hedge_budget.spend() {
                        bump(&self.stats.hedges_refused, 1);
                        continue;
                    }
                    bump(&self.stats.hedges, 1);
                    bump(&self.stats.store_hedges, 1);
                    hedge = Some(Box::pin(async move {
                        Ok(self.ufs()?.stat_path(path).await?)
                    }));
                }
            }
        };
        if matches!(answer, Attempt::Answer(_)) {
            return Ok(answer);
        }
        // The member failed: a hedge in flight answers instead.
        if let Some(h) = hedge {
            let r = h.await;
            if answered(&r) {
                bump(&self.stats.hedges_won, 1);
                bump(&self.stats.metadata_fallbacks, 1);
                return Err(HedgedStat::Store(r));
            }
            failed = r.err();
        }
        match failed {
            Some(e) => Err(HedgedStat::StoreFailed(e, answer)),
            None => Ok(answer),
        }
    }

    /// Size, version and file id of the file at `path` (an error for directories).
    pub async fn stat(&self, path: &str) -> Result<ObjectInfo, Error> {
        match self.stat_path(path).await? {
            PathKind::File {
                size,
                version_tag,
                file_id,
                mtime_ns,
                state,
                store_tag,
            } => Ok(ObjectInfo {
                path: path.to_string(),
                size,
                version: version_tag,
                file_id: file_id.as_u128(),
                mtime_ns,
                state,
                store_tag,
            }),
            PathKind::Dir { .. } => Err(Error::IsDir(path.to_string())),
        }
    }

    /// Every entry of directory `path`, sorted by name.
    pub async fn list(&self, path: &str) -> Result<Vec<DirEntry>, Error> {
        let mut out: Vec<DirEntry> = Vec::new();
        self.list_pages(path, |page| out.extend_from_slice(page))
            .await?;
        Ok(out)
    }

    /// [`Client::list`] a page at a time: `each` gets the entries of every page of the listing
    /// as it arrives (sorted by name, each entry once), so that a caller can start on the first
    /// entries of a large directory while the rest are listed. A member that stops answering
    /// mid-listing is followed by the next one from where it stopped. An error may come after
    /// some pages were given.
    pub async fn list_pages(
        &self,
        path: &str,
        mut each: impl FnMut(&[DirEntry]),
    ) -> Result<(), Error> {
        check_path(path)?;
        let path = match path.trim_end_matches('/') {
            "" => "/",
            p => p,
        };
        // The last name given to `each`, and whether any entry was.
        let mut last: Option<String> = None;
        for addr in self.metadata_members(path) {
            loop {
                let body = RequestBody::List {
                    path: path.into(),
                    start_after: last.clone().unwrap_or_default(),
                };
                match self.ask(addr, body).await {
                    Attempt::Answer(r) => match r.map_err(|e| named(e, path))? {
                        (ResponseBody::Listing { entries, more }, _) => {
                            // Only entries after the last one given (a member answers in name
                            // order; this keeps each entry once whatever it sends).
                            let from = last
                                .as_deref()
                                .map_or(0, |l| entries.partition_point(|e| e.name.as_str() <= l));
                            let fresh = &entries[from.min(entries.len())..];
                            if let Some(e) = fresh.last() {
                                last = Some(e.name.clone());
                                each(fresh);
                            }
                            if !more || fresh.is_empty() {
                                return self.listed(path, last.is_none()).await;
                            }
                        }
                        (other, _) => {
                            return Err(Error::unavailable(format!("unexpected answer {other:?}")))
                        }
                    },
                    Attempt::Failed(_) | Attempt::StoreFailed(_) | Attempt::Unverified(_) => break,
                }
            }
        }
        if self.write_policy(path).is_cached() {
            return Err(Error::unavailable(format!(
                "{path}: no member answered, and files written through the cluster are known to its members only"
            )));
        }
        let ufs = self.ufs()?;
        bump(&self.stats.metadata_fallbacks, 1);
        let v = ufs.list_entries(path).await?;
        let from = last
            .as_deref()
            .map_or(0, |l| v.partition_point(|e| e.name.as_str() <= l));
        if from < v.len() {
            each(&v[from..]);
        }
        self.listed(path, last.is_none() && v.is_empty()).await
    }

    /// An empty listing of something that is not a directory is an error.
    async fn listed(&self, path: &str, empty: bool) -> Result<(), Error> {
        if empty {
            match self.stat_path(path).await? {
                PathKind::Dir { .. } => {}
                PathKind::File { .. } => return Err(Error::NotDir(path.to_string())),
            }
        }
        Ok(())
    }

    /// Reads `len` bytes at `offset` of page `page` of `info` (fewer at the end of the file):
    /// from the owner, else a replica, else the under storage. A request that is late may be
    /// hedged: the next of those sources is asked as well, the first answer taken and the other
    /// request cancelled ([`ClientOptions::hedge_min`], [`ClientOptions::hedge_ratio`]).
    pub async fn read_page(
        &self,
        info: &ObjectInfo,
        page: u64,
        offset: u32,
        len: u32,
    ) -> Result<Bytes, Error> {
        let layout = self.layout();
        let ps = u64::from(layout.page_size);
        let page_start = page.saturating_mul(ps);
        if page_start >= info.size {
            return Ok(Bytes::new());
        }
        let file = FileRef {
            file_id: FileId::from_u128(info.file_id),
            mount: String::new(),
            path: info.path.clone(),
            version_tag: info.version.clone(),
            size: info.size,
        };
        let ring = layout.membership.ring();
        // A file written through the cluster and not flushed yet lives on its write members
        // only (and one flushed is read from them first).
        let written = is_wb_tag(&info.version);
        let tries = if written {
            usize::from(layout.write_replicas()) + WRITE_SLOP
        } else {
            1 + layout.replicas as usize
        };
        // A page its owner said is hot goes to one of its first `spread` members in turn.
        let now = Instant::now();
        let spread = usize::from(self.hot.spread_of(info.file_id, page, now));
        let members: Vec<MemberId> = ring.replicas(info.file_id, page, tries.max(spread));
        let spread = spread.min(members.len());
        let first = if spread > 1 {
            self.hot.pick(page, spread as u8)
        } else {
            0
        };
        let route_of = |i: usize| {
            if i == 0 {
                Route::Owner
            } else if i == first {
                Route::Hot
            } else {
                Route::Fallback
            }
        };
        let fetch_as = |route: Route| RequestBody::Fetch {
            file: file.clone(),
            page,
            offset,
            len,
            epoch: ring.epoch(),
            route,
        };
        let fetch = |i: usize| fetch_as(route_of(i));
        // The store holds the file (one written through the cluster only once flushed).
        let in_store = !(written && info.store_tag.is_empty());
        let start = page_start + u64::from(offset);
        let range = start
            ..(start + u64::from(len))
                .min(page_start + ps)
                .min(info.size)
                .max(start);
        let hedging = self.options.fallback && self.options.hedge_ratio > 0.0;
        if hedging {
            self.hedge_budget.earn();
        }
        let page_of = PageRead {
            info,
            page,
            spread,
            written,
            now,
            unverified: std::sync::Mutex::default(),
            changed: std::sync::Mutex::default(),
        };
        // The picked member first, then the usual order: the owner, then the fallbacks.
        let order =
            std::iter::once(first).chain((0..tries.min(members.len())).filter(|&i| i != first));
        let mut sources = order
            .filter_map(|i| {
                let m = &members[i];
                if layout.down.contains(&m.node) {
                    bump(&self.stats.skipped_dead, 1);
                    return None;
                }
                layout.membership.addr_of(*m).map(|addr| (i, addr))
            })
            .peekable();
        // At most one hedge per read: in flight, or spent.
        let mut hedge: Option<HedgeFuture<'_>> = None;
        let mut hedged = false;
        let mut to_store = false;
        // What the under storage answered a hedge that failed (it is not asked twice).
        let mut store_failed: Option<Error> = None;
        while let Some((i, addr)) = sources.next() {
            let route = route_of(i);
            // Where a hedge of this request would go: the next member, else (no member left)
            // the under storage. Another write member of a written file holds the page too
            // and is asked once this request is late; the others (a `--replicas` replica would
            // load a page it lacks from the store; the owner of a hot page is what its spread
            // members relieve) only once this member is silent.

            let target = match sources.peek() {
                _ if !hedging || hedged => None,
                Some(&(j, a)) => Some(HedgeTarget::Member {
                    index: j,
                    addr: a,
                    // Not the owner of a hot page asked of a spread member: hedging the
                    // spread members' late reads to it would undo the spreading.
                    holds: written,
                }),
                None if in_store && self.ufs.is_some() && store_failed.is_none() => {
                    Some(HedgeTarget::Store)
                }
                None => None,
            };
            let quiet = !matches!(target, Some(HedgeTarget::Member { holds: true, .. }));
            let sent = Instant::now();
            let ask = self.ask(addr, fetch(i));
            let point = async {
                if target.is_some() {
                    self.hedge_point(addr, sent, quiet).await
                } else {
                    std::future::pending().await
                }
            };
            tokio::pin!(ask, point);
            let answer = loop {
                tokio::select! {
                    a = &mut ask => break a,
                    Some(done) = OptionFuture::from(hedge.as_mut()), if hedge.is_some() => {
                        hedge = None;
                        match self.hedge_done(&page_of, done, &mut store_failed) {
                            Step::Done(Ok(b)) => {
                                bump(&self.stats.hedges_won, 1);
                                // The first request is cancelled: settle what it would have
                                // (whether its member is gone) without it.
                                self.settle_later(addr, sent);
                                return Ok(b);
                            }
                            Step::Done(Err(e)) => return Err(e),
                            Step::ToStore => to_store = true,
                            Step::Next => {}
                        }
                    }
                    () = &mut point, if !hedged => {
                        hedged = true;
                        // A member backed off after failures would refuse the hedge at once.
                        if let Some(HedgeTarget::Member { addr: a, .. }) = target {
                            if !self.reachable(a) {
                                continue;
                            }
                        }
                        if !self.hedge_budget.spend() {
                            bump(&self.stats.hedges_refused, 1);
                            continue;
                        }
                        bump(&self.stats.hedges, 1);
                        match target {
                            Some(HedgeTarget::Member { index, addr: a, .. }) => {
                                // The next member is taken by the hedge.
                                sources.next();
                                let (r, body) = (route_of(index), fetch(index));
                                hedge = Some(Box::pin(async move {
                                    HedgeDone::Member(r, a, self.ask(a, body).await)
                                }));
                            }
                            Some(HedgeTarget::Store) => {
                                bump(&self.stats.store_hedges, 1);
                                let range = range.clone();
                                hedge = Some(Box::pin(async move {
                                    HedgeDone::Store(self.store_read(info, range).await)
                                }));
                            }
                            None => {}
                        }
                    }
                }
            };
            // The first request ended: an answer is taken (and a hedge in flight cancelled);
            // a failure makes the hedge, if any, the next source.
            match self.judge(&page_of, addr, route, answer) {
                Step::Done(r) => return r,
                Step::ToStore => to_store = true,
                Step::Next => {}
            }
            if let Some(h) = hedge.take() {
                match self.hedge_done(&page_of, h.await, &mut store_failed) {
                    Step::Done(r) => {
                        if r.is_ok() {
                            bump(&self.stats.hedges_won, 1);
                        }
                        return r;
                    }
                    Step::ToStore => to_store = true,
                    Step::Next => {}
                }
            }
            if to_store {
                break;
            }
        }
        // Only recovered copies (members back from a restart or from being counted down): the
        // page's other members hold none, so one of these is the page's last bytes. A file in
        // the under storage is read from there instead.
        let recovered =
            std::mem::take(&mut *page_of.unverified.lock().unwrap_or_else(|e| e.into_inner()));
        if !in_store {
            for addr in recovered {
                match self.judge(
                    &page_of,
                    addr,
                    Route::Recovered,
                    self.ask(addr, fetch_as(Route::Recovered)).await,
                ) {
                    Step::Done(r) => return r,
                    Step::ToStore | Step::Next => {}
                }
            }
            if let Some(e) = page_of
                .changed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
            {
                return Err(e);
            }
            return Err(Error::unavailable(format!(
                "no write member of page {page} of {} answered, and the file is not in the \
                 under storage yet",
                info.path
            )));
        }
        if let Some(e) = store_failed {
            return Err(e);
        }
        self.store_read(info, range).await
    }

    /// Reads `range` of `info` from the under storage, as the cluster could not (counted as a
    /// fallback).
    async fn store_read(
        &self,
        info: &ObjectInfo,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes, Error> {
        let ufs = self.ufs()?;
        let bytes = ufs.read(info, range).await?;
        bump(&self.stats.fallbacks, 1);
        bump(&self.stats.ufs_bytes, bytes.len() as u64);
        Ok(bytes)
    }

    /// What a member's answer to a page request means for the read: the bytes (counted by
    /// route), a definite error, or where to go next.
    fn judge(
        &self,
        p: &PageRead<'_>,
        addr: SocketAddr,
        route: Route,
        answer: Attempt<(ResponseBody, Bytes)>,
    ) -> Step {
        let info = p.info;
        match answer {
            // A member that loaded a miss of a flushed file written through the cluster from
            // the store and found another object there (its record names the other of two
            // flushes of one version that raced, until the records agree; docs/ARCHITECTURE.md,
            // "Flushing"): the page's other write members hold the page itself.
            Attempt::Answer(Err(e @ Error::Changed(_))) if p.written => {
                *p.changed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                Step::Next
            }
            Attempt::Answer(r) => {
                let (body, payload) = match r {
                    Ok(a) => a,
                    Err(e) => return Step::Done(Err(e)),
                };
                bump(&self.stats.cluster_bytes, payload.len() as u64);
                let counter = match route {
                    Route::Owner => {
                        // News from the owner: hot, still hot, or cooled (the lock is taken
                        // only when there is news).
                        if let ResponseBody::Data { spread: said, .. } = body {
                            if said > 1 || p.spread > 1 {
                                self.hot.owner_said(info.file_id, p.page, said, p.now);
                            }
                        }
                        &self.stats.owner_reads
                    }
                    Route::Hot => &self.stats.hot_reads,
                    Route::Fallback | Route::Recovered => &self.stats.replica_reads,
                };
                bump(counter, 1);
                Step::Done(Ok(payload))
            }
            Attempt::Unverified(_) => {
                p.unverified
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(addr);
                Step::Next
            }
            Attempt::Failed(_) if route == Route::Hot => {
                // That member could not serve the page as a replica: ask the owner next,
                // and keep asking it until it says again that the page is hot.
                self.hot.forget(info.file_id, p.page);
                Step::Next
            }
            Attempt::Failed(_) if !self.options.fallback => {
                Step::Done(Err(Error::unavailable(format!(
                    "member {addr} could not serve page {} of {} and fallback is off",
                    p.page, info.path
                ))))
            }
            Attempt::Failed(_) => Step::Next,
            // A replica would load the page from the same store again: at most one more
            // store read, this client's own (if fallback is on). Not so for a file written
            // through the cluster: its other write members hold the page itself.
            Attempt::StoreFailed(_) if p.written => {
                bump(&self.stats.store_errors, 1);
                Step::Next
            }
            Attempt::StoreFailed(_) => {
                bump(&self.stats.store_errors, 1);
                if !self.options.fallback {
                    return Step::Done(Err(Error::unavailable(format!(
                        "member {addr} could not load page {} of {} from the under storage \
                         and fallback is off",
                        p.page, info.path
                    ))));
                }
                Step::ToStore
            }
        }
    }

    /// What a hedge's answer means for the read; a failed store read is kept in
    /// `store_failed` (the read does not ask the store again) and the first request waited
    /// for.
    fn hedge_done(
        &self,
        p: &PageRead<'_>,
        done: HedgeDone,
        store_failed: &mut Option<Error>,
    ) -> Step {
        match done {
            HedgeDone::Member(route, addr, answer) => self.judge(p, addr, route, answer),
            HedgeDone::Store(Ok(b)) => Step::Done(Ok(b)),
            HedgeDone::Store(Err(e)) => {
                *store_failed = Some(e);
                Step::Next
            }
        }
    }

    /// Resolves when a request sent to `addr` at `sent` should be hedged, and never when it
    /// should not be. Not `quiet`: the member's hedge delay ([`Latency::hedge_delay`]) after
    /// sending. `quiet`: the member must be silent: it has answered nothing, to this request
    /// or any other, for its hedge delay (at least half of `min_silence`), and then neither a
    /// ping nor anything else within as long, while a member of another node answers a ping
    /// sent at the same time (or it missed such a ping already since it last answered: it is
    /// probably gone, and the request is hedged after the first wait). A member that answers
    /// the ping is working on the request (a page it loads from a slow store, a queue of
    /// loads): the request is not hedged.
    async fn hedge_point(&self, addr: SocketAddr, sent: Instant, quiet: bool) {
        let (floor, ceiling) = (self.options.hedge_min, self.options.call_timeout);
        loop {
            let Some((l, own)) = self.latency_of(addr) else {
                // No member has answered this client yet: the request is judged once a
                // member of another node answers a ping, as the silence rule judges it.
                let (from, at) = (sent + self.options.min_silence / 2, sent + ceiling);
                if self.stranger_answers(addr, from, at).await {
                    continue;
                }
                return std::future::pending().await;
            };
            let delay = l.hedge_delay(floor, ceiling);
            // Silence is judged no faster than half the silence rule's floor (100 ms by
            // default): a live member starved of CPU for a few tens of milliseconds must not
            // look silent, and a silent member's request is hedged well before the silence
            // rule (at least `min_silence` of silence, then a ping as long) gives it up, so the
            // hedge's read has that long to answer first.
            let wait = delay.max(self.options.min_silence / 2);
            let at = if quiet {
                sent.max(l.last_answer()) + wait
            } else {
                sent + delay
            };
            if Instant::now() < at {
                tokio::time::sleep_until(at.into()).await;
                continue;
            }
            if !quiet || (own && l.suspect()) {
                return;
            }
            match self.ping_verdict(addr, wait).await {
                // Working on it (perhaps waiting on a slow store): not hedged.
                Verdict::Alive => return std::future::pending().await,
                Verdict::Unknown => continue,
                Verdict::Silent | Verdict::SilentAlone | Verdict::Gone => return,
            }
        }
    }

    /// A member of another node to ping beside `addr` as a control (a stopped node's other
    /// shards are as silent): the one that answered last.
    fn control_member(&self, addr: SocketAddr) -> Option<SocketAddr> {
        let layout = self.layout();
        let node_of = |a: SocketAddr| node_of(&layout.membership, a);
        let mine = node_of(addr);
        let t = self.timing.lock().unwrap_or_else(|p| p.into_inner());
        t.iter()
            .filter(|(a, _)| **a != addr && (mine.is_none() || node_of(**a) != mine))
            .max_by_key(|(_, l)| l.last_answer())
            .map(|(a, _)| *a)
    }

    /// A hedge was answered before the request sent to `addr` at `sent`, which is cancelled:
    /// a watcher in the background settles what that request would have, whether the member
    /// is gone (one watcher per member at a time; see [`Client::settle`]).
    fn settle_later(&self, addr: SocketAddr, sent: Instant) {
        {
            let mut s = self.settling.lock().unwrap_or_else(|p| p.into_inner());
            if !s.insert(addr) {
                return;
            }
        }
        let me = self.me.clone();
        tokio::spawn(async move {
            Client::settle(&me, addr, sent).await;
            if let Some(c) = me.upgrade() {
                let mut s = c.settling.lock().unwrap_or_else(|p| p.into_inner());
                s.remove(&addr);
            }
        });
    }

    /// The silence rule for a request to `addr` sent at `sent` that a hedge made needless: if
    /// the member answers anything after it, or a ping, it is alive and nothing changes; if it
    /// stays silent for its silence limit and misses a ping, it is given up (backed off) as
    /// the request would have been. Holds the client only while it pings.
    async fn settle(me: &Weak<Client>, addr: SocketAddr, sent: Instant) {
        loop {
            let (at, limit, usual) = {
                let Some(c) = me.upgrade() else { return };
                let (floor, ceiling) = (c.options.min_silence, c.options.call_timeout);
                let Some((l, own)) = c.latency_of(addr) else {
                    return;
                };
                if own && l.last_answer() > sent {
                    return;
                }
                (
                    l.give_up_at(sent, floor, ceiling),
                    l.silence_limit(floor, ceiling),
                    l.usual(),
                )
            };
            if Instant::now() < at {
                tokio::time::sleep_until(at.into()).await;
                continue;
            }
            let Some(c) = me.upgrade() else { return };
            match c.ping_verdict(addr, limit).await {
                Verdict::Alive => return,
                Verdict::Unknown => continue,
                Verdict::Silent | Verdict::SilentAlone | Verdict::Gone => {}
            }
            bump(&c.stats.silent_gives_up, 1);
            c.pool.forget(addr);
            c.failed(
                addr,
                &format!(
                    "no answer for {limit:?}, not even to a ping, while a hedge was answered \
                     (it usually answers within {usual:?})"
                ),
            );
            return;
        }
    }

    /// The whole of page `page` of `file` from its owner under this client's ring, and from
    /// nowhere else (no replica, no under storage): how a node copies a hot page from its peer
    /// (`Source::read_from_owner`). Errors when the owner cannot give it.
    pub async fn read_from_owner(&self, file: &FileRef, page: u64) -> Result<Bytes, Error> {
        let layout = self.layout();
        let ring = layout.membership.ring();
        let owner = ring
            .owner(file.file_id.as_u128(), page)
            .and_then(|m| layout.membership.addr_of(m))
            .ok_or_else(|| Error::unavailable("the ring has no owner for the page"))?;
        let body = RequestBody::Fetch {
            file: file.clone(),
            page,
            offset: 0,
            len: layout.page_size,
            epoch: ring.epoch(),
            route: Route::Owner,
        };
        let (_, payload) = self.ask(owner, body).await.into_result()?;
        bump(&self.stats.cluster_bytes, payload.len() as u64);
        bump(&self.stats.owner_reads, 1);
        Ok(payload)
    }

    /// Reads up to `len` bytes at `offset` of `info` (fewer at the end of the file, none past
    /// it), fetching the covered pages in parallel.
    pub async fn read_at(&self, info: &ObjectInfo, offset: u64, len: u64) -> Result<Bytes, Error> {
        let end = offset.saturating_add(len).min(info.size);
        if offset >= end {
            return Ok(Bytes::new());
        }
        let ps = u64::from(self.page_size());
        let (first, last) = (offset / ps, (end - 1) / ps);
        if first == last {
            let off = (offset - first * ps) as u32;
            return self
                .read_page(info, first, off, (end - offset) as u32)
                .await;
        }
        let parts = stream::iter(first..=last)
            .map(|p| {
                let s = offset.max(p * ps);
                let e = end.min((p + 1) * ps);
                async move {
                    let b = self
                        .read_page(info, p, (s - p * ps) as u32, (e - s) as u32)
                        .await?;
                    // A short page inside the file means the object is not what was opened.
                    if b.len() as u64 != e - s {
                        return Err(Error::Changed(format!(
                            "{}: page {p} has {} bytes where {} were expected; the object \
                             changed",
                            info.path,
                            b.len(),
                            e - s
                        )));
                    }
                    Ok(b)
                }
            })
            .buffered(self.options.parallel.max(1));
        let mut out = BytesMut::with_capacity((end - offset) as usize);
        let mut parts = std::pin::pin!(parts);
        while let Some(b) = parts.try_next().await? {
            out.extend_from_slice(&b);
        }
        Ok(out.freeze())
    }

    /// Reads `range` of the file at `path` (clipped at its end).
    pub async fn read(&self, path: &str, range: std::ops::Range<u64>) -> Result<Bytes, Error> {
        let info = self.stat(path).await?;
        self.read_at(&info, range.start, range.end.saturating_sub(range.start))
            .await
    }

    /// Preloads every page of `info` into the cluster: the pages are grouped by owner and each
    /// owner is asked (`LoadPages`) to load those it does not hold yet from the under storage.
    /// Returns the pages newly loaded, their bytes, and the pages that were already cached.
    /// Each request has the store's allowance, as `LoadFiles` ([`Client::ask_load`]): a shard
    /// busy loading answers late, and a load given up would only have to start again.
    pub async fn load(&self, info: &ObjectInfo) -> Result<LoadOutcome, Error> {
        let layout = self.layout();
        let ps = u64::from(layout.page_size);
        let pages = info.size.div_ceil(ps);
        let ring = layout.membership.ring();
        let mut by_owner: HashMap<SocketAddr, Vec<u64>> = HashMap::new();
        for p in 0..pages {
            let addr = ring
                .owner(info.file_id, p)
                .and_then(|m| layout.membership.addr_of(m))
                .ok_or_else(|| Error::unavailable("the ring has no members"))?;
            by_owner.entry(addr).or_default().push(p);
        }
        let file = FileRef {
            file_id: FileId::from_u128(info.file_id),
            mount: String::new(),
            path: info.path.clone(),
            version_tag: info.version.clone(),
            size: info.size,
        };
        let mut asks = Vec::new();
        for (addr, list) in by_owner {
            for batch in list.chunks(256) {
                let body = RequestBody::LoadPages {
                    file: file.clone(),
                    pages: batch.to_vec(),
                    epoch: ring.epoch(),
                };
                let n = batch.len() as u64;
                asks.push(async move { (addr, n, self.ask_load(addr, body).await) });
            }
        }
        let mut out = LoadOutcome::default();
        for (addr, n, a) in futures_util::future::join_all(asks).await {
            match a? {
                ResponseBody::Loaded { pages, bytes } => {
                    out.loaded += u64::from(pages);
                    out.bytes += bytes;
                    out.present += n.saturating_sub(u64::from(pages));
                }
                other => return Err(Error::unavailable(format!("{addr} answered {other:?}"))),
            }
        }
        Ok(out)
    }

    /// Preloads many files in few requests: the pages of `files` are grouped by owner shard,
    /// and each owner gets `LoadFiles` requests naming many files each (up to
    /// [`frame::MAX_LOAD_FILES`], [`frame::MAX_LOAD_PAGES`] pages and one header; the first
    /// requests to each owner are small, so that the first pages are cached at once), at most
    /// `inflight` requests at a time over the cluster and two per owner, owners in turn.
    /// `done(i, outcome)` is called once per file of `files` (in no particular order) when
    /// every owner of its pages has answered: what was loaded, or why the file failed. A file
    /// failing does not fail the others; a request that fails (its owner unreachable, or not
    /// the owner under its ring) fails the files it named, each with the reason. Nothing falls
    /// back to the under storage: preloading is the cluster's business.
    pub async fn load_many<F>(&self, files: &[ObjectInfo], inflight: usize, mut done: F)
    where
        F: FnMut(usize, Result<LoadOutcome, Error>),
    {
        let layout = self.layout();
        let ps = u64::from(layout.page_size).max(1);
        let ring = layout.membership.ring();
        let epoch = ring.epoch();
        // Per file: requests outstanding, and the outcome so far.
        let mut waiting: Vec<u32> = vec![0; files.len()];
        let mut outcome: Vec<Result<LoadOutcome, Error>> = (0..files.len())
            .map(|_| Ok(LoadOutcome::default()))
            .collect();
        // Per owner, in the order owners first appear: entries (file index, its pages there).
        let mut owners: Vec<SocketAddr> = Vec::new();
        let mut by_owner: HashMap<SocketAddr, Vec<(usize, Vec<u64>)>> = HashMap::new();
        for (i, info) in files.iter().enumerate() {
            // A file's owners are few (one for a small file): a list, not a map.
            let mut mine: Vec<(SocketAddr, Vec<u64>)> = Vec::new();
            let mut lost = false;
            for p in 0..info.size.div_ceil(ps) {
                match ring
                    .owner(info.file_id, p)
                    .and_then(|m| layout.membership.addr_of(m))
                {
                    Some(addr) => match mine.iter_mut().find(|(a, _)| *a == addr) {
                        Some((_, pages)) => pages.push(p),
                        None => mine.push((addr, vec![p])),
                    },
                    None => lost = true,
                }
            }
            if lost {
                outcome[i] = Err(Error::unavailable("the ring has no members"));
            }
            for (addr, pages) in mine {
                // A file with very many pages on one owner goes in several entries.
                for chunk in pages.chunks(LOAD_ENTRY_PAGES) {
                    waiting[i] += 1;
                    let list = by_owner.entry(addr).or_insert_with(|| {
                        owners.push(addr);
                        Vec::new()
                    });
                    list.push((i, chunk.to_vec()));
                }
            }
        }
        for (i, w) in waiting.iter().enumerate() {
            if *w == 0 {
                let r = std::mem::replace(&mut outcome[i], Ok(LoadOutcome::default()));
                done(i, r);
            }
        }
        // The requests, owners in turn: the first few to each owner small, then full ones.
        let mut per_owner: Vec<std::collections::VecDeque<Vec<(usize, frame::LoadFile)>>> =
            Vec::new();
        for addr in &owners {
            let mut batches = std::collections::VecDeque::new();
            let mut batch: Vec<(usize, frame::LoadFile)> = Vec::new();
            let (mut cost, mut pages) = (0usize, 0usize);
            let mut room = LOAD_FIRST_BATCH;
            for (i, list) in by_owner.remove(addr).unwrap_or_default() {
                let info = &files[i];
                let entry = frame::LoadFile {
                    file: FileRef {
                        file_id: FileId::from_u128(info.file_id),
                        mount: String::new(),
                        path: info.path.clone(),
                        version_tag: info.version.clone(),
                        size: info.size,
                    },
                    pages: list,
                };
                let c = entry.header_cost();
                if !batch.is_empty()
                    && (batch.len() == room
                        || cost + c > frame::LOAD_FILES_HEADER_BUDGET
                        || pages + entry.pages.len() > frame::MAX_LOAD_PAGES)
                {
                    batches.push_back(std::mem::take(&mut batch));
                    (cost, pages) = (0, 0);
                    room = (room * 2).min(frame::MAX_LOAD_FILES);
                }
                cost += c;
                pages += entry.pages.len();
                batch.push((i, entry));
            }
            if !batch.is_empty() {
                batches.push_back(batch);
            }
            per_owner.push(batches);
        }
        let mut requests = Vec::new();
        while per_owner.iter().any(|b| !b.is_empty()) {
            for (k, batches) in per_owner.iter_mut().enumerate() {
                if let Some(b) = batches.pop_front() {
                    requests.push((owners[k], b));
                }
            }
        }
        // A shard works on the requests it holds at once: more than a few per owner would only
        // make each of them take longer.
        let inflight = inflight.min(LOAD_PER_OWNER * owners.len()).max(1);
        let asks = stream::iter(requests)
            .map(|(addr, batch)| async move {
                let (index, entries): (Vec<usize>, Vec<frame::LoadFile>) =
                    batch.into_iter().unzip();
                let pages: Vec<u64> = entries.iter().map(|e| e.pages.len() as u64).collect();
                let body = RequestBody::LoadFiles {
                    files: entries,
                    epoch,
                };
                (addr, index, pages, self.ask_load(addr, body).await)
            })
            .buffer_unordered(inflight);
        let mut asks = std::pin::pin!(asks);
        while let Some((addr, index, pages, answer)) = asks.next().await {
            let each: Vec<Result<(u64, u64), Error>> = match answer {
                Ok(ResponseBody::FilesLoaded { outcomes }) => outcomes
                    .into_iter()
                    .map(|o| match o {
                        frame::FileOutcome::Loaded { pages, bytes } => {
                            Ok((u64::from(pages), bytes))
                        }
                        frame::FileOutcome::Failed { code, message, .. } => {
                            Err(answered_error(code, format!("{addr}: {message}")))
                        }
                    })
                    .collect(),
                Ok(other) => index
                    .iter()
                    .map(|_| Err(Error::unavailable(format!("{addr} answered {other:?}"))))
                    .collect(),
                Err(e) => index.iter().map(|_| Err(same_error(&e))).collect(),
            };
            for ((i, asked), r) in index.into_iter().zip(pages).zip(each) {
                match (&mut outcome[i], r) {
                    (Ok(o), Ok((loaded, bytes))) => {
                        o.loaded += loaded;
                        o.bytes += bytes;
                        o.present += asked.saturating_sub(loaded);
                    }
                    (out @ Ok(_), Err(Error::NotFound(_))) => {
                        *out = Err(Error::NotFound(files[i].path.clone()))
                    }
                    (out @ Ok(_), Err(e)) => *out = Err(e),
                    (Err(_), _) => {}
                }
                waiting[i] -= 1;
                if waiting[i] == 0 {
                    let r = std::mem::replace(&mut outcome[i], Ok(LoadOutcome::default()));
                    done(i, r);
                }
            }
        }
    }

    /// One `LoadFiles` or `LoadPages` request to `addr` and its answer (an error answer,
    /// `NotOwner` and a failure to reach the member as an [`Error`]). Its shard answers only
    /// once it has read and kept every page named, so it is given the store's allowance
    /// (`ClientOptions::store_timeout`), not the call timeout; a slow answer says nothing of
    /// the member's usual answer time, and is not counted in it.
    async fn ask_load(&self, addr: SocketAddr, body: RequestBody) -> Result<ResponseBody, Error> {
        // Held to the outcome: dropped with it (or with this future), it lets the next
        // request probe; `succeeded` or `failed` below has settled the member by then.
        let Some(_probe) = self.usable(addr) else {
            return Err(Error::unavailable(format!(
                "{addr} is backed off after failures"
            )));
        };
        let req = Request {
            request_id: self.next_id.fetch_add(1, Ordering::Relaxed),
            body,
        };
        let timeout = self.options.store_timeout.max(self.options.call_timeout);
        match self
            .pool
            .request_within(addr, &req, Bytes::new(), timeout)
            .await
        {
            Err(e) => {
                self.failed(addr, &e.to_string());
                Err(Error::unavailable_from(
                    format!("member {addr} could not load the file's pages: {e}"),
                    e,
                ))
            }
            Ok((resp, _)) => {
                self.succeeded(addr);
                match resp.body {
                    ResponseBody::Error { code, message } => {
                        Err(answered_error(code, format!("{addr}: {message}")))
                    }
                    ResponseBody::NotOwner { epoch } => {
                        tracing::warn!(%addr, epoch, "member says it is not the owner");
                        if let Some(wake) = &self.refresh {
                            wake.notify_one();
                        }
                        Err(Error::unavailable(format!(
                            "{addr} does not own the file's pages under its ring (epoch \
                             {epoch}); run the job again once the clients follow the new ring"
                        )))
                    }
                    other => Ok(other),
                }
            }
        }
    }

    /// Sends `body` to every shard of every node and parses each answer with `parse`, by node
    /// and shard; `None` where the shard did not answer (or answered something else).
    async fn ask_every_shard<T>(
        &self,
        body: RequestBody,
        parse: fn(ResponseBody, Bytes) -> Option<T>,
    ) -> Vec<(NodeInfo, u16, Option<T>)> {
        let layout = self.layout();
        let mut asks = Vec::new();
        for n in layout.membership.nodes() {
            for s in 0..n.shards {
                let req = Request {
                    request_id: self.next_id.fetch_add(1, Ordering::Relaxed),
                    body: body.clone(),
                };
                asks.push(async move {
                    let c = match self.pool.request(n.shard_addr(s), &req, Bytes::new()).await {
                        Ok((resp, payload)) => parse(resp.body, payload),
                        Err(_) => None,
                    };
                    (*n, s, c)
                });
            }
        }
        futures_util::future::join_all(asks).await
    }

    /// Every shard's counters (`Stat`), by node and shard; `None` where the shard did not answer.
    pub async fn shard_stats(&self) -> Vec<(NodeInfo, u16, Option<ShardStat>)> {
        self.ask_every_shard(RequestBody::Stat, |body, _| match body {
            ResponseBody::Stat {
                pages,
                bytes,
                capacity_bytes,
                hits,
                misses,
                ..
            } => Some(ShardStat {
                pages,
                bytes,
                capacity_bytes,
                hits,
                misses,
            }),
            _ => None,
        })
        .await
    }

    /// Sends a preload job's progress record to every live node, which keep it for `pagectl
    /// jobs` and `/v1/jobs`. Returns how many nodes took it (0 for a record beyond the limits
    /// of [`JobRecord::validate`]).
    pub async fn report_job(&self, record: &JobRecord) -> usize {
        let payload = match frame::encode_job_record(record) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(job = %record.id, error = %e, "job record not sent");
                return 0;
            }
        };
        let layout = self.layout();
        let asks = layout
            .membership
            .nodes()
            .filter(|n| !layout.down.contains(&n.id))
            .map(|n| self.jobs_call(n.shard_addr(0), &payload))
            .collect::<Vec<_>>();
        futures_util::future::join_all(asks)
            .await
            .iter()
            .filter(|r| r.is_ok())
            .count()
    }

    /// The job records the nodes keep, merged (one per job id, the most recently updated),
    /// most recently updated first.
    pub async fn jobs(&self) -> Result<Vec<JobRecord>, Error> {
        let layout = self.layout();
        let asks = layout
            .membership
            .nodes()
            .filter(|n| !layout.down.contains(&n.id))
            .map(|n| self.jobs_call(n.shard_addr(0), &[]))
            .collect::<Vec<_>>();
        let mut by_id: HashMap<String, JobRecord> = HashMap::new();
        let mut answered = 0;
        let mut last_err = None;
        for r in futures_util::future::join_all(asks).await {
            match r {
                Ok(list) => {
                    answered += 1;
                    for v in list {
                        let newer = by_id.get(&v.id).is_none_or(|old| v.updated > old.updated);
                        if newer {
                            by_id.insert(v.id.clone(), v);
                        }
                    }
                }
                Err(e) => last_err = Some(e),
            }
        }
        if answered == 0 {
            let why = last_err
                .as_ref()
                .map_or("no live node".into(), Error::to_string);
            return Err(Error::Unavailable {
                message: format!("no node answered for job records ({why})"),
                source: last_err.map(BoxError::from),
            });
        }
        let mut v: Vec<JobRecord> = by_id.into_values().collect();
        v.sort_by(|a, b| {
            b.updated
                .partial_cmp(&a.updated)
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        Ok(v)
    }

    async fn jobs_call(&self, addr: SocketAddr, record: &[u8]) -> Result<Vec<JobRecord>, Error> {
        let req = Request {
            request_id: self.next_id.fetch_add(1, Ordering::Relaxed),
            body: RequestBody::Jobs,
        };
        let (resp, payload) = self
            .pool
            .request(addr, &req, Bytes::copy_from_slice(record))
            .await
            .map_err(|e| Error::unavailable_from(e.to_string(), e))?;
        match resp.body {
            ResponseBody::Jobs => frame::decode_job_records(&payload)
                .map_err(|e| Error::unavailable_from(format!("{addr}: job records: {e}"), e)),
            ResponseBody::Error { message, .. } => Err(Error::unavailable(message)),
            other => Err(Error::unavailable(format!("{addr} answered {other:?}"))),
        }
    }

    /// Every shard's counters (`Counters`), by node and shard; `None` where the shard did not
    /// answer, or answered with a malformed record (logged).
    pub async fn shard_counters(&self) -> Vec<(NodeInfo, u16, Option<ShardCounters>)> {
        self.ask_every_shard(RequestBody::Counters, |body, payload| match body {
            ResponseBody::Counters => frame::decode_counters(&payload)
                .inspect_err(|e| tracing::warn!(error = %e, "malformed Counters answer"))
                .ok(),
            _ => None,
        })
        .await
    }

    /// Every shard's hottest files and pages and bytes per mount (`Hot`), by node and shard;
    /// `None` where the shard did not answer, or answered with a malformed report (logged).
    pub async fn hot_reports(&self) -> Vec<(NodeInfo, u16, Option<HotReport>)> {
        self.ask_every_shard(RequestBody::Hot, |body, payload| match body {
            ResponseBody::Hot => frame::decode_hot_report(&payload)
                .inspect_err(|e| tracing::warn!(error = %e, "malformed Hot answer"))
                .ok(),
            _ => None,
        })
        .await
    }

    /// The mount table this client reads the under storage with directly (fallback), if any.
    pub fn ufs_table(&self) -> Option<&MountTable> {
        self.ufs.as_deref()
    }

    /// Tells every shard of every node that `path` changed: they drop the pages of `old` (the
    /// file id of the version replaced, if known) and their cached metadata of the path. Nodes
    /// that cannot be reached are skipped (their metadata expires with the TTL; their pages of
    /// the old version are never read again, because new readers use the new file id). Returns
    /// the pages dropped.
    pub async fn invalidate(&self, path: &str, old: Option<u128>) -> u64 {
        match self.invalidate_checked(path, old).await {
            Ok(pages) => pages,
            Err(e) => {
                tracing::warn!(path, error = %e, "the cluster did not drop the old version's pages and metadata; readers see the change when the metadata TTL expires");
                0
            }
        }
    }

    /// [`Client::invalidate`], failing with [`Error::Forbidden`] when any shard refused it
    /// (this client's certificate lacks the writer role).
    pub async fn invalidate_checked(&self, path: &str, old: Option<u128>) -> Result<u64, Error> {
        let layout = self.layout();
        let mut asks = Vec::new();
        for n in layout.membership.nodes() {
            for s in 0..n.shards {
                asks.push(self.ask(
                    n.shard_addr(s),
                    RequestBody::Invalidate {
                        path: path.to_string(),
                        file_id: FileId::from_u128(old.unwrap_or(0)),
                    },
                ));
            }
        }
        let mut pages = 0;
        let mut refused = None;
        for a in futures_util::future::join_all(asks).await {
            match a {
                Attempt::Answer(Ok((ResponseBody::Removed { pages: n }, _))) => {
                    pages += u64::from(n)
                }
                Attempt::Answer(Err(e @ Error::Forbidden(_))) => refused = Some(e),
                _ => {}
            }
        }
        refused.map_or(Ok(pages), Err)
    }

    /// Writes `data` as the object at `path`. On a `through` mount it goes to the under
    /// storage (this client needs a mount table with write access: `Client::connect` with
    /// `ufs`), then the cluster drops what it caches of the old version; on a `back` or
    /// `transient` mount it is written through the cluster ([`Client::write_file`]).
    pub async fn put(self: &Arc<Self>, path: &str, data: Bytes) -> Result<ObjectInfo, Error> {
        crate::ufs::check_written_path(path)?;
        if self.write_policy(path).is_cached() {
            return self.write_file(path, data).await;
        }
        let ufs = self.writable()?;
        let old = ufs.stat(path).await.ok().map(|i| i.file_id);
        ufs.put(path, data).await?;
        self.invalidate(path, old).await;
        Ok(ufs.stat(path).await?)
    }

    /// Deletes the object at `path`: in the under storage, then in the cluster's caches (a
    /// `through` mount); through the cluster, which deletes it in the under storage later (a
    /// `back` or `transient` mount).
    pub async fn delete(&self, path: &str) -> Result<(), Error> {
        crate::ufs::check_written_path(path)?;
        if self.write_policy(path).is_cached() {
            return self.remove_file(path).await;
        }
        let ufs = self.writable()?;
        let old = ufs.stat(path).await.ok().map(|i| i.file_id);
        ufs.delete(path).await?;
        self.invalidate(path, old).await;
        Ok(())
    }

    /// The mount table for writes (whatever the fallback setting).
    pub fn writable(&self) -> Result<&MountTable, Error> {
        self.ufs.as_deref().ok_or_else(|| {
            Error::config(
                "writes go through to the under storage: give the client a mount table with \
                 credentials",
            )
        })
    }

    /// Opens `path` for reading: the handle reads the version that exists now, whatever
    /// happens to the object later.
    pub async fn open(self: &Arc<Self>, path: &str) -> Result<crate::FileHandle, Error> {
        let info = self.stat(path).await?;
        Ok(crate::FileHandle::new(self.clone(), info))
    }
}

/// Pages of one file one `LoadFiles` entry names at most (a file with more pages on one owner
/// takes several entries).
const LOAD_ENTRY_PAGES: usize = 1024;

/// `LoadFiles` requests in flight to one owner at most ([`Client::load_many`]).
const LOAD_PER_OWNER: usize = 2;

/// Files of the first `LoadFiles` request to each owner; each next request takes twice as
/// many, up to [`frame::MAX_LOAD_FILES`].
const LOAD_FIRST_BATCH: usize = 8;

/// The client error for a shard's answer `code` with `message` (a file's outcome of a batch).
fn answered_error(code: ErrorCode, message: String) -> Error {
    match code {
        ErrorCode::NotFound => Error::NotFound(message),
        ErrorCode::Changed => Error::Changed(message),
        ErrorCode::BadRange => Error::BadRange(message),
        ErrorCode::BadRequest => Error::BadPath(message),
        ErrorCode::Forbidden => Error::Forbidden(message),
        ErrorCode::Full => Error::NoSpace(message),
        _ => Error::unavailable(message),
    }
}

/// An error like `e` (the same kind and text), for each of the files a request named.
fn same_error(e: &Error) -> Error {
    match e {
        Error::NotFound(m) => Error::NotFound(m.clone()),
        Error::Changed(m) => Error::Changed(m.clone()),
        Error::BadRange(m) => Error::BadRange(m.clone()),
        Error::BadPath(m) => Error::BadPath(m.clone()),
        Error::Forbidden(m) => Error::Forbidden(m.clone()),
        Error::NoSpace(m) => Error::NoSpace(m.clone()),
        other => Error::unavailable(other.to_string()),
    }
}

/// The mount (longest prefix) that holds `path`.
pub(crate) fn mount_entry<'a>(mounts: &'a [MountEntry], path: &str) -> Option<&'a MountEntry> {
    mounts
        .iter()
        .filter(|m| {
            let p = m.prefix.trim_end_matches('/');
            p.is_empty() || path == p || path.starts_with(&format!("{p}/"))
        })
        .max_by_key(|m| m.prefix.len())
}

/// A NotFound answer names the path the caller asked for (the member's text says the same in
/// its own words).
fn named(e: Error, path: &str) -> Error {
    match e {
        Error::NotFound(_) => Error::NotFound(path.to_string()),
        e => e,
    }
}

fn check_path(path: &str) -> Result<(), Error> {
    Ok(crate::ufs::check_path(path)?)
}

/// The members of a `ClusterInfo` answer.
fn node_infos(nodes: &[pagestore_protocol::frame::NodeEntry]) -> Result<Vec<NodeInfo>, Error> {
    nodes
        .iter()
        .map(|n| {
            Ok(NodeInfo {
                id: n.id.as_u128(),
                addr: n.addr.parse().map_err(|_| {
                    Error::config(format!("member address {:?} is not IP:PORT", n.addr))
                })?,
                shards: n.shards,
            })
        })
        .collect()
}

/// Keeps a client that found the cluster through a member's address on the cluster's member
/// list: asks a member again every `period` (zero: only when woken) and whenever `wake` is
/// notified (a member said it does not own a key), at most twice a second. Ends when the
/// client is dropped.
fn follow_members(
    client: std::sync::Weak<Client>,
    wake: Arc<tokio::sync::Notify>,
    period: Duration,
    seed: SocketAddr,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut turn = 0usize;
        loop {
            if period.is_zero() {
                wake.notified().await;
            } else {
                tokio::select! {
                    _ = tokio::time::sleep(period) => {}
                    _ = wake.notified() => {}
                }
            }
            let Some(c) = client.upgrade() else {
                return;
            };
            c.refresh_members(seed, turn).await;
            drop(c);
            turn = turn.wrapping_add(1);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

/// What a client learns of its cluster source: the member list it names (none for a bare
/// address), the addresses to ask for the cluster's settings, and the etcd state to follow.
type Resolved = (
    Option<Vec<NodeInfo>>,
    Vec<SocketAddr>,
    Option<(Arc<Etcd>, ClusterState)>,
);

async fn resolve_source(
    source: &ClusterSource,
    options: &ClientOptions,
) -> Result<Resolved, Error> {
    Ok(match source {
        ClusterSource::File(path) => {
            let nodes = read_member_file(path)?;
            let addrs = nodes.iter().map(|n| n.addr).collect();
            (Some(nodes), addrs, None)
        }
        ClusterSource::Addr(a) => (None, vec![*a], None),
        ClusterSource::Etcd(url) => {
            let settings = match &options.etcd {
                Some(o) => o.clone(),
                None => {
                    EtcdOptions::from_env().map_err(|e| Error::config_from(e.to_string(), e))?
                }
            };
            let etcd =
                Etcd::new(url, &settings).map_err(|e| Error::config_from(e.to_string(), e))?;
            let etcd = Arc::new(etcd);
            let state = etcd.state().await.map_err(|e| match e {
                crate::etcd::EtcdError::Auth(_) | crate::etcd::EtcdError::Config(_) => {
                    Error::config_from(
                        format!(
                            "{e} (or give a member's IP:PORT instead: readers need no etcd access)"
                        ),
                        e,
                    )
                }
                e => Error::unavailable_from(format!("{e} (the client needs etcd to start)"), e),
            })?;
            let probe = state.live.values().map(|r| r.info.addr).collect();
            let nodes = state.ring_nodes();
            (Some(nodes), probe, Some((etcd, state)))
        }
    })
}

/// The local UDP address to bind: loopback when every member is on loopback (so a test cluster
/// needs no other interface), the unspecified address of the members' family otherwise.
fn local_bind(probe: &[SocketAddr]) -> Result<SocketAddr, Error> {
    let loopback = probe.iter().all(|a| a.ip().is_loopback());
    match (probe.first(), loopback) {
        (Some(a), true) if a.is_ipv6() => "[::1]:0",
        (_, true) => "127.0.0.1:0",
        (Some(a), false) if a.is_ipv6() => "[::]:0",
        _ => "0.0.0.0:0",
    }
    .parse()
    .map_err(|e: std::net::AddrParseError| Error::config_from(e.to_string(), e))
}

/// What a `Cluster` request answers.
struct ClusterAnswer {
    page_size: u32,
    epoch: u64,
    replicas: u8,
    write_replicas: u8,
    nodes: Vec<frame::NodeEntry>,
    mounts: Vec<MountEntry>,
}

/// The cluster's settings as the first member in `probe` that answers gives them: page size,
/// ring epoch, replicas, members and mount table.
async fn ask_cluster(pool: &Pool, probe: &[SocketAddr]) -> Result<ClusterAnswer, Error> {
    let mut last_err = String::from("no member to ask");
    let mut cause: Option<ClientError> = None;
    for addr in probe {
        let req = Request {
            request_id: 1,
            body: RequestBody::Cluster,
        };
        match pool.request(*addr, &req, Bytes::new()).await {
            Ok((resp, _)) => match resp.body {
                ResponseBody::ClusterInfo {
                    page_size,
                    epoch,
                    replicas,
                    nodes,
                    mounts,
                    write_replicas,
                } => {
                    return Ok(ClusterAnswer {
                        page_size,
                        epoch,
                        replicas,
                        write_replicas,
                        nodes,
                        mounts,
                    })
                }
                other => {
                    last_err = format!("{addr} answered {other:?}");
                    cause = None;
                }
            },
            Err(e) => {
                last_err = e.to_string();
                cause = Some(e);
            }
        }
    }
    Err(Error::Unavailable {
        message: format!(
            "no cluster member answered ({last_err}); check --cluster, that pagestored runs, and \
             the TLS settings"
        ),
        source: cause.map(BoxError::from),
    })
}

fn read_member_file(path: &Path) -> Result<Vec<NodeInfo>, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        let message = format!(
            "cannot read member file {}: {e} (--cluster takes a member file or IP:PORT)",
            path.display()
        );
        Error::config_from(message, e)
    })?;
    parse_member_file(&text).map_err(|e| Error::config(format!("{}: {e}", path.display())))
}

/// A mount table for fallback from the cluster's (credential-free) mounts. Mounts that cannot
/// be opened here (e.g. S3 without credentials in the environment) are left out with a warning:
/// their reads then depend on the cluster, and a fallback read of them is an error that says
/// so (`Error::Config`), never "not found".
fn fallback_table(mounts: &[MountEntry]) -> Option<Arc<MountTable>> {
    let pairs: Vec<(String, String)> = mounts
        .iter()
        .map(|m| (m.prefix.clone(), m.url.clone()))
        .collect();
    // Paths under a mount that cannot be opened here are unavailable, not missing.
    Some(Arc::new(MountTable::new_partial(&pairs)))
}

#[cfg(test)]
mod tests;
