//! A node's write-back side (docs/ARCHITECTURE.md, "Write-back"): the records of the files,
//! directories and deletions made through the cluster on `back` and `transient` mounts, kept
//! durably by every node and handed from node to node; the flusher that writes closed files to
//! the under storage and marks them clean; the reconciler that keeps this node's dirty pages in
//! step with the records.
//!
//! - [`records`]: the table itself, a state machine without I/O.
//! - [`journal`]: the table on disk.
//! - [`overlay`]: the under storage as the shards see it, with the records laid over it.
//!
//! Everything here runs on the node's tokio runtime. The shards reach it through the
//! [`WriteBack`] seam; it reaches the shards of this node through [`Node`], and the other nodes
//! through a client of the cluster with this node's own certificate (role `node`).

pub mod journal;
pub mod overlay;
pub mod records;

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    path::Path,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, OnceLock, RwLock, Weak,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use futures_util::{stream::FuturesUnordered, StreamExt};
use pagestore_client::{ufs::ObjectInfo, Client};
use pagestore_mounts::ufs::{self, PartUploads, PutOutcome, UfsError, UfsSource};
use pagestore_protocol::{
    frame::{
        encode_file_records, Attr, ChangeOp, ErrorCode, Expect, FileId, FileRecord, FileState,
        PageAction, PathKind, RecordEntry, RecordState, RequestBody, ResponseBody,
        WriteBackSummary, MAX_RECORDS_OF, MAX_RECORD_BATCH,
    },
    ring::path_hash,
    source::{SourceError, SourceFuture},
    writeback::{check_change_path, effective_replicas, fresh_tag, unix_ms, Hlc, WriteBack},
};
use pagestore_server::node::Node;

use journal::Journal;
use records::{version_id, Applied, Plan, Rank, Records, Refused};

/// The longest pause between two flush attempts of one file (they start at 1 s and double).
pub const MAX_FLUSH_BACKOFF: Duration = Duration::from_secs(10);

/// Settings of a node's write-back side.
#[derive(Clone, Debug)]
pub struct WriteBackSettings {
    /// Nodes that keep each dirty page and record before a write is acknowledged (the
    /// cluster's, clamped to its size).
    pub write_replicas: u8,
    /// A version whose writer has been silent this long is sealed and flushed without it.
    pub lease: Duration,
    /// Files one node flushes at once, within [`WriteBackSettings::flush_memory`].
    pub flush_parallel: usize,
    /// Bytes of one part of a multipart flush (and of a flush read).
    pub flush_part: usize,
    /// Dirty pages no record holds (a writer gone before its first commit) are dropped this
    /// long after the newest of them was written or renewed by its writer (`Renew`).
    pub orphan_grace: Duration,
    /// How long records that need no more work are remembered after the change that made
    /// them: deletions applied to the under storage, files flushed to it. (A forgotten file is
    /// the store's object, under the store's version.)
    pub keep_records: Duration,
    /// Records a node keeps, at most, before it refuses changes that add a path (`Full`)
    /// until settled ones are forgotten: the bound on the memory the records take.
    pub max_records: usize,
    /// How often the node pulls every record from a peer, and checks its dirty pages against
    /// the records.
    pub sync_interval: Duration,
}

impl Default for WriteBackSettings {
    fn default() -> Self {
        WriteBackSettings {
            write_replicas: 2,
            lease: Duration::from_secs(120),
            flush_parallel: 32,
            flush_part: 16 << 20,
            orphan_grace: pagestore_protocol::writeback::DEFAULT_ORPHAN_GRACE,
            keep_records: Duration::from_secs(24 * 3600),
            max_records: 1_000_000,
            sync_interval: Duration::from_secs(30),
        }
    }
}

/// Whether the store's object at `path` (`found`: what a stat of it answered) meets the
/// condition `expect` of a change the records cannot judge; `Precondition` otherwise.
fn store_meets(path: &str, expect: &Expect, found: Option<&PathKind>) -> Result<(), SourceError> {
    let current = match found {
        Some(PathKind::File { version_tag, .. }) => Some(version_tag.as_str()),
        _ => None,
    };
    records::expect_met(path, expect, current)
        .map_err(|m| SourceError::new(ErrorCode::Precondition, m))
}

/// Settled records taken out of the table under one hold of its write lock.
const FORGET_BATCH: usize = 4096;

/// A peer's clock this far ahead of this node's (milliseconds) is logged when first seen.
const CLOCK_LEAD_WARN_MS: u64 = 1_000;

/// Rounds of `RecordsOf` a node spends confirming its live records beneath directories its
/// peers did not show them under ([`WriteBackNode::confirm_beneath`]), each of at most
/// [`MAX_RECORDS_OF`] paths; what is left then waits for the periodic pull.
const CONFIRM_ROUNDS: usize = 16;

/// Parts of one file's multipart flush sent to the under storage at once.
pub const FLUSH_PARTS: usize = 4;

/// Large files one node flushes at once: the flushes in progress hold at most the bytes of
/// this many large files' flushes ([`WriteBackSettings::flush_memory`]); small files take
/// their own size of it, so many flush at once.
pub const FLUSH_LARGE_FILES: u64 = 4;

impl WriteBackSettings {
    /// Bytes one file's flush holds at most: its size, or for a large file the parts in
    /// flight and the one being read from the cluster.
    fn flush_cost(&self, size: u64) -> u64 {
        size.min((FLUSH_PARTS as u64 + 1) * self.part())
    }

    /// The bytes the flushes in progress on one node may hold together:
    /// [`FLUSH_LARGE_FILES`] large files' worth (320 MiB with 16 MiB parts).
    pub fn flush_memory(&self) -> u64 {
        FLUSH_LARGE_FILES * self.flush_cost(u64::MAX)
    }

    /// Whether a flush that holds `cost` bytes may start beside `running` flushes that hold
    /// `held` bytes: within the parallelism and the memory (one flush always may).
    fn may_start(&self, running: usize, held: u64, cost: u64) -> bool {
        running < self.flush_parallel.max(1) && (running == 0 || held + cost <= self.flush_memory())
    }

    /// Bytes of one part of a multipart flush (at least S3's 5 MiB).
    fn part(&self) -> u64 {
        self.flush_part.max(5 << 20) as u64
    }
}

/// Why the write-back side could not start.
#[derive(Debug, thiserror::Error)]
pub enum WriteBackError {
    /// The journal cannot be opened or read.
    #[error("write-back journal in {}", dir.display())]
    Journal {
        /// Its directory.
        dir: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Counters of the flusher (since the node started).
#[derive(Default, Debug)]
pub struct FlushStats {
    /// Files written to the under storage.
    pub files: AtomicU64,
    /// Their bytes.
    pub bytes: AtomicU64,
    /// Deletions applied to the under storage.
    pub deletes: AtomicU64,
    /// Flush attempts that failed (each is retried with back-off).
    pub errors: AtomicU64,
    /// Versions sealed because their writer went silent.
    pub seals: AtomicU64,
    /// Files being flushed now.
    pub flushing: AtomicU64,
    /// Dirty pages dropped because no record holds them.
    pub orphans_dropped: AtomicU64,
    /// Pages of replaced or deleted versions demoted (evicted before any other page).
    pub pages_retired: AtomicU64,
    /// Settled records forgotten ([`WriteBackSettings::keep_records`]).
    pub forgotten: AtomicU64,
    /// Records of a change's paths taken from the peers before the change was judged.
    pub caught_up: AtomicU64,
    /// Pulls of the peers' records finished (the one at start included).
    pub pulls: AtomicU64,
    /// Records taken by those pulls (ranking above what this node held).
    pub pulled: AtomicU64,
    /// `RecordsIn` of peers answered `Same` (they held what this node holds of the entries).
    pub listings_same: AtomicU64,
    /// Rounds of `RecordsOf` spent confirming this node's live records beneath directories
    /// ([`WriteBackNode::confirm_beneath`]).
    pub confirm_rounds: AtomicU64,
}

/// A snapshot for `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct WriteBackMetrics {
    /// Records kept.
    pub records: u64,
    /// What waits for the under storage, over all mounts.
    pub summary: WriteBackSummary,
    /// Files flushed, bytes flushed, deletions applied, errors, seals, orphans dropped.
    pub flushed_files: u64,
    /// Bytes flushed.
    pub flushed_bytes: u64,
    /// Deletions applied to the store.
    pub deletes: u64,
    /// Failed flush attempts.
    pub errors: u64,
    /// Versions sealed.
    pub seals: u64,
    /// Orphan dirty pages dropped.
    pub orphans_dropped: u64,
    /// Pages of replaced or deleted versions demoted.
    pub pages_retired: u64,
    /// Settled records forgotten.
    pub forgotten: u64,
    /// [`WriteBackSettings::max_records`].
    pub records_limit: u64,
    /// Journal bytes.
    pub journal_bytes: u64,
    /// How far ahead of the wall clock the change stamps run ([`Hlc::lead_ms`]).
    pub clock_lead_ms: u64,
    /// Records of a change's paths this node lacked, or held older, and took from its peers
    /// before it judged the change ([`WriteBackNode::gather`]).
    pub caught_up: u64,
    /// Pulls of the peers' records finished, the one at start included.
    pub pulls: u64,
    /// Records those pulls took.
    pub pulled: u64,
    /// `RecordsIn` of peers answered `Same`.
    pub listings_same: u64,
    /// Rounds spent confirming live records beneath directories.
    pub confirm_rounds: u64,
}

/// A node's write-back side (see the module docs).
pub struct WriteBackNode {
    this: Weak<WriteBackNode>,
    me: u128,
    hlc: Hlc,
    settings: WriteBackSettings,
    table: RwLock<Records>,
    journal: Arc<Mutex<Journal>>,
    ufs: Arc<UfsSource>,
    node: OnceLock<Weak<Node>>,
    peers: OnceLock<Arc<Client>>,
    /// Set once enough peers gave all their records at start ([`WriteBackNode::pull_all`]),
    /// or the pull at start ended: until then this node's records may miss changes made while
    /// it was down.
    pulled_at_start: std::sync::atomic::AtomicBool,
    /// Nodes in the ring when no peer client is connected yet.
    initial_nodes: usize,
    /// One change at a time is planned and applied here.
    change_lock: tokio::sync::Mutex<()>,
    /// The paths being flushed, and the bytes each flush may hold.
    flushing: Mutex<HashMap<String, u64>>,
    backoff: Mutex<HashMap<String, (Instant, Duration)>>,
    last_error: Mutex<String>,
    stats: FlushStats,
    wake: tokio::sync::Notify,
    /// Where this node's futures run (the shards call in from their own threads).
    runtime: tokio::runtime::Handle,
}

/// The paths whose records judge `op`: those it names, then their ancestors nearest first
/// (a file or a deleted directory above a path decides too), at most [`MAX_RECORDS_OF`].
fn touched_paths(op: &ChangeOp) -> Vec<String> {
    with_ancestors(&named_paths(op))
}

/// `named` and the directories above each, at most [`MAX_RECORDS_OF`] paths.
fn with_ancestors(named: &[&str]) -> Vec<String> {
    let mut paths: Vec<String> = named.iter().map(|p| p.to_string()).collect();
    for &p in named {
        let mut cur = p;
        while let Some(a) = pagestore_protocol::writeback::parent(cur) {
            if paths.len() == MAX_RECORDS_OF {
                return paths;
            }
            if !paths.iter().any(|q| q == a) {
                paths.push(a.to_string());
            }
            cur = a;
        }
    }
    paths
}

/// The paths `op` names: its path, or a rename's source and destination.
fn named_paths(op: &ChangeOp) -> Vec<&str> {
    match op {
        ChangeOp::Commit { path, .. }
        | ChangeOp::Delete { path, .. }
        | ChangeOp::MakeDir { path, .. }
        | ChangeOp::SetTime { path, .. } => vec![path],
        ChangeOp::Rename { from, to, .. } => vec![from, to],
    }
}

/// How long [`ask_peers`] waits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Wait {
    /// For every peer asked to answer or fail.
    All,
    /// For `need` answers: `need` peers are asked first, another one for each that fails
    /// (then the peers backed off, as for `All`); asks still out once `need` answered are
    /// dropped.
    Need,
}

/// Sends `body` with `payload` to each of the peers `addrs` at once (to `need` of them first
/// with [`Wait::Need`]) and sorts their answers with `take` (which peer, what it answered):
/// what the peers that answered gave, and why the others did not (`addr: why`).
/// Peers backed off after failures in `client` are asked too (all at once) as soon as the
/// others can no longer give `need` answers (they are too few, or enough of them failed): a
/// peer that was frozen or restarting may well answer before its back-off (up to the client's
/// longest, 30 s by default) runs out, and the change that needs it would fail without it.
async fn ask_peers<T>(
    client: &Client,
    addrs: &[SocketAddr],
    (body, payload): (&RequestBody, Bytes),
    need: usize,
    wait: Wait,
    take: impl Fn(SocketAddr, Result<(ResponseBody, Bytes), String>) -> Result<T, String>,
) -> (Vec<T>, Vec<String>) {
    let (ready, backed_off): (Vec<SocketAddr>, Vec<SocketAddr>) =
        addrs.iter().partition(|&&a| client.reachable(a));
    let ask = |addr: SocketAddr, despite: bool| {
        let (body, payload) = (body.clone(), payload.clone());
        async move {
            let r = if despite {
                client.call_despite_backoff(addr, body, payload).await
            } else {
                client.call(addr, body, payload).await
            };
            (addr, r)
        }
    };
    let first = match wait {
        Wait::All => ready.len(),
        Wait::Need => need,
    };
    let mut ready = ready.into_iter();
    let mut asks: FuturesUnordered<_> = ready.by_ref().take(first).map(|a| ask(a, false)).collect();
    let mut spare = Some(backed_off);
    let (mut given, mut failures) = (Vec::new(), Vec::new());
    loop {
        if wait == Wait::Need && given.len() >= need {
            break;
        }
        while given.len() + asks.len() < need {
            let Some(a) = ready.next() else {
                break;
            };
            asks.push(ask(a, false));
        }
        if given.len() + asks.len() < need {
            for a in spare.take().unwrap_or_default() {
                asks.push(ask(a, true));
            }
        }
        let Some((addr, r)) = asks.next().await else {
            break;
        };
        match take(addr, r.map_err(|e| e.to_string())) {
            Ok(t) => given.push(t),
            Err(why) => failures.push(format!("{addr}: {why}")),
        }
    }
    (given, failures)
}

/// `addrs` in order for [`Wait::All`]; for [`Wait::Need`], rotated by a count that changes
/// from call to call, so that the peers asked first differ each time.
fn rotated(mut addrs: Vec<SocketAddr>, wait: Wait) -> Vec<SocketAddr> {
    if wait == Wait::Need {
        let k = (pagestore_protocol::writeback::unix_ns() as usize) % addrs.len().max(1);
        addrs.rotate_left(k);
    }
    addrs
}

/// A peer's `Records` answer: its records, and whether more follow.
fn records_page(
    r: Result<(ResponseBody, Bytes), String>,
) -> Result<(Vec<FileRecord>, bool), String> {
    match r? {
        (ResponseBody::Records { more }, payload) => {
            pagestore_protocol::frame::decode_file_records(&payload)
                .map(|v| (v, more))
                .map_err(|e| format!("malformed records: {e}"))
        }
        (other, _) => Err(format!("{other:?}")),
    }
}

/// The records one peer gave, by path and rank ([`FileRecord::order`]).
type Told = HashSet<(String, (u64, u128, u8))>;

fn told_of(records: &[FileRecord]) -> Told {
    records
        .iter()
        .map(|r| (r.path.clone(), r.order()))
        .collect()
}

/// Whether every peer in `told` gave `r`, at its rank: each holds it live too.
fn told_by_all(told: &[Told], r: &FileRecord) -> bool {
    let key = (r.path.clone(), r.order());
    told.iter().all(|t| t.contains(&key))
}

/// Whether `path` lies beneath directory `dir` (the root: every other path).
fn beneath(dir: &str, path: &str) -> bool {
    path.strip_prefix(dir.trim_end_matches('/'))
        .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1)
}

/// The name of the entry of directory `dir` that `path` is or lies beneath.
fn entry_name<'p>(dir: &str, path: &'p str) -> Option<&'p str> {
    let rest = path
        .strip_prefix(dir.trim_end_matches('/'))?
        .strip_prefix('/')?;
    rest.split('/').next().filter(|n| !n.is_empty())
}

/// Whether what `op` does depends on what its path holds now, so that a node that missed a
/// record of it would answer wrongly: a conditional commit or delete, a rename that must not
/// replace, a new directory.
fn judged(op: &ChangeOp) -> bool {
    match op {
        ChangeOp::Commit { expect, .. } | ChangeOp::Delete { expect, .. } => {
            !matches!(expect, Expect::Any)
        }
        ChangeOp::Rename { replace, .. } => !replace,
        ChangeOp::MakeDir { .. } => true,
        ChangeOp::SetTime { .. } => false,
    }
}

fn refused(r: Refused) -> SourceError {
    SourceError::new(r.code, r.message)
}

fn store_error(e: impl std::fmt::Display) -> SourceError {
    SourceError::new(ErrorCode::Io, e.to_string())
}

/// Whether a flush of version `tag` of `path`, about to make its object appear in a store
/// that cannot do it conditionally, is still the one to do: `record`, the path's record now,
/// names `tag`, and `found`, the store's version of the object now (`None`: none), is what
/// `expected` (the write's condition, from what the flush found when it started) asks for.
/// `Changed` otherwise: the flush is given up (the upload aborted) and tried again later if
/// its version still needs it.
fn still_current(
    path: &str,
    tag: &str,
    record: Option<&FileRecord>,
    expected: &object_store::PutMode,
    found: Option<&str>,
) -> Result<(), SourceError> {
    let named = matches!(
        record.map(|r| &r.entry),
        Some(RecordEntry::File { version_tag, .. }) if version_tag == tag
    );
    if !named {
        return Err(SourceError::new(
            ErrorCode::Changed,
            format!("{path}: a newer change replaced the version being flushed; not written"),
        ));
    }
    let unchanged = match (expected, found) {
        (object_store::PutMode::Create, None) => true,
        (object_store::PutMode::Update(v), Some(now)) => {
            v.e_tag.as_deref().map(|t| t.trim_matches('"')) == Some(now)
        }
        (object_store::PutMode::Overwrite, _) => true,
        _ => false,
    };
    if !unchanged {
        return Err(raced(path));
    }
    Ok(())
}

/// The answer for a journal append that failed: `Full` when the cache directory's disk has no
/// room for it (the writer sees "no space", ENOSPC through pagefs, not a failed node), `Io`
/// otherwise. Nothing of the change was kept either way.
fn journal_error(e: std::io::Error) -> SourceError {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => SourceError::new(
            ErrorCode::Full,
            format!(
                "write-back journal: {e}: the disk of this node's cache directory is full \
                 (the journal grows beside the cache files); free space there"
            ),
        ),
        _ => SourceError::new(ErrorCode::Io, format!("write-back journal: {e}")),
    }
}

/// Whether `rec` is a closed (or sealed) file record of write-back version `tag`.
fn waits_for_flush(rec: &FileRecord, tag: &str) -> bool {
    matches!(
        &rec.entry,
        RecordEntry::File {
            version_tag,
            state: RecordState::Final | RecordState::Sealed,
            ..
        } if version_tag == tag
    )
}

/// The store's object at `path` changed while a flush wrote it.
fn raced(path: &str) -> SourceError {
    SourceError::new(
        ErrorCode::Changed,
        format!(
            "{path}: the store's object changed while it was flushed (another node flushing \
             it at the same time); flushing again later"
        ),
    )
}

impl WriteBackNode {
    /// Opens the journal in `dir` (creating it) and restores the records it holds.
    pub fn open(
        dir: &Path,
        me: u128,
        settings: WriteBackSettings,
        ufs: Arc<UfsSource>,
        initial_nodes: usize,
        runtime: tokio::runtime::Handle,
    ) -> Result<Arc<WriteBackNode>, WriteBackError> {
        let (journal, kept) = Journal::open(dir).map_err(|source| WriteBackError::Journal {
            dir: dir.to_path_buf(),
            source,
        })?;
        let hlc = Hlc::new();
        let mut table = Records::new();
        table.set_limit(settings.max_records);
        for r in kept {
            hlc.observe(r.hlc);
            table.apply(r);
        }
        if !table.is_empty() {
            tracing::info!(
                records = table.len(),
                "write-back records restored from the journal"
            );
        }
        Ok(Arc::new_cyclic(|this| WriteBackNode {
            this: this.clone(),
            me,
            hlc,
            settings,
            table: RwLock::new(table),
            journal: Arc::new(Mutex::new(journal)),
            ufs,
            node: OnceLock::new(),
            peers: OnceLock::new(),
            pulled_at_start: std::sync::atomic::AtomicBool::new(false),
            initial_nodes: initial_nodes.max(1),
            change_lock: tokio::sync::Mutex::new(()),
            flushing: Mutex::new(HashMap::new()),
            backoff: Mutex::new(HashMap::new()),
            last_error: Mutex::new(String::new()),
            stats: FlushStats::default(),
            wake: tokio::sync::Notify::new(),
            runtime,
        }))
    }

    /// The records, for reading.
    pub fn table(&self) -> std::sync::RwLockReadGuard<'_, Records> {
        self.table.read().unwrap_or_else(|p| p.into_inner())
    }

    fn table_mut(&self) -> std::sync::RwLockWriteGuard<'_, Records> {
        self.table.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The under storage this node writes to.
    pub fn ufs(&self) -> &Arc<UfsSource> {
        &self.ufs
    }

    /// Starts the background work once the node serves: connects to the peers (this node's own
    /// endpoint is the seed), pulls their records, then flushes, reconciles and keeps in step.
    /// `client` is this node's client of the cluster (its own certificate).
    pub fn run(
        self: &Arc<Self>,
        node: &Arc<Node>,
        client: Arc<Client>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let _ = self.node.set(Arc::downgrade(node));
        let _ = self.peers.set(client);
        let mut tasks = Vec::new();
        let me = self.clone();
        tasks.push(tokio::spawn(async move {
            me.pull_all(true).await;
            me.pulled_at_start.store(true, Ordering::Release);
            me.flush_loop().await;
        }));
        let me = self.clone();
        tasks.push(tokio::spawn(async move { me.sync_loop().await }));
        tasks
    }

    fn node(&self) -> Option<Arc<Node>> {
        self.node.get().and_then(Weak::upgrade)
    }

    /// This node's client of its peers (once the node serves).
    pub(crate) fn peers(&self) -> Option<&Arc<Client>> {
        self.peers.get()
    }

    /// The other nodes: (id, shard 0's address).
    fn other_nodes(&self) -> Vec<(u128, SocketAddr)> {
        let Some(c) = self.peers() else {
            return Vec::new();
        };
        c.membership()
            .nodes()
            .filter(|n| n.id != self.me)
            .map(|n| (n.id, n.shard_addr(0)))
            .collect()
    }

    fn nodes(&self) -> usize {
        self.peers().map_or(self.initial_nodes, |c| {
            c.membership().nodes().count().max(1)
        })
    }

    fn replicas(&self) -> usize {
        effective_replicas(self.settings.write_replicas, self.nodes())
    }

    /// Keeps `records` durably, applies them, does what they mean for this node's pages and
    /// caches. `gone_to_cache`: leave the pages of versions the records leave to no file to the
    /// cache as ordinary pages (only for a change's records taken together, never for a page of
    /// a pull, whose later pages may name them again). Returns what applying did.
    async fn keep(
        &self,
        records: Vec<FileRecord>,
        gone_to_cache: bool,
    ) -> Result<Applied, SourceError> {
        let (now, keep_ms) = (
            self.hlc.now_ms(),
            self.settings.keep_records.as_millis() as u64,
        );
        let ranked: Vec<(Rank, FileRecord)> = {
            let t = self.table();
            records
                .into_iter()
                .map(|r| (t.rank(&r), r))
                .filter(|(rank, r)| *rank != Rank::Below && !t.forgotten_by_now(r, now, keep_ms))
                .collect()
        };
        let mut fresh = Vec::with_capacity(ranked.len());
        for (rank, r) in ranked {
            if rank == Rank::Restamp && !self.store_holds(&r).await {
                continue;
            }
            fresh.push(r);
        }
        if fresh.is_empty() {
            return Ok(Applied::default());
        }
        for r in &fresh {
            if let Some(lead) = self.hlc.observe(r.hlc) {
                if lead >= CLOCK_LEAD_WARN_MS {
                    tracing::warn!(
                        lead_ms = lead,
                        origin = ?r.origin,
                        "a peer's clock runs ahead of this node's; this node's change stamps follow it (check the nodes' time sync)"
                    );
                }
            }
        }
        let node = self
            .this
            .upgrade()
            .ok_or_else(|| SourceError::new(ErrorCode::Unavailable, "the node is stopping"))?;
        let applied = tokio::task::spawn_blocking(move || {
            // The journal's lock is held until the table has the records too: a compaction
            // writes the table under that lock, and must never drop a record the journal took.
            let mut j = node.journal.lock().unwrap_or_else(|p| p.into_inner());
            j.append(&fresh)?;
            Ok::<_, std::io::Error>(node.table_mut().apply_batch(fresh))
        })
        .await
        .map_err(store_error)?
        .map_err(journal_error)?;
        self.act_on(&applied, gone_to_cache).await;
        self.wake.notify_one();
        Ok(applied)
    }

    /// Whether the store holds the object a flushed record names (a [`Rank::Restamp`] is
    /// taken only then; a store that cannot be asked keeps the record this node has).
    async fn store_holds(&self, rec: &FileRecord) -> bool {
        let RecordEntry::File { store_tag, .. } = &rec.entry else {
            return false;
        };
        let now = self.ufs.table().stat(&rec.path).await;
        let holds = now.as_ref().is_ok_and(|m| &m.version == store_tag);
        tracing::info!(
            path = %rec.path,
            %store_tag,
            holds,
            "a version reached the store twice; the record that names the store's object stays"
        );
        holds
    }

    /// What applied records mean for this node's shards: flushed versions become ordinary
    /// pages, sealed ones take no more pages, versions no file holds any more become ordinary
    /// cached pages too (`gone_to_cache`), and the metadata the shards cached of the paths is
    /// forgotten.
    async fn act_on(&self, applied: &Applied, gone_to_cache: bool) {
        let Some(node) = self.node() else {
            return;
        };
        for &id in &applied.sealed {
            if let Err(e) = node.file_pages(id, PageAction::Seal).await {
                tracing::warn!(error = %e, "sealing a version on this node");
            }
        }
        for &id in &applied.cleaned {
            if let Err(e) = node.file_pages(id, PageAction::Clean).await {
                tracing::warn!(error = %e, "marking a flushed version's pages clean");
            }
        }
        if gone_to_cache {
            // A version replaced or deleted may still be open for reading: its pages become
            // ordinary cached pages (never flushed), so a reader that opened it reads on as
            // long as they stay cached, as a flushed file's readers do once the store's object
            // is replaced; they are evicted before any other page (one read since gives a page
            // the place of a page read once), so checkpoints rewritten in place do not push the
            // working set out.
            for &id in &applied.gone {
                match node.retire_file(id).await {
                    Ok(n) if n > 0 => {
                        self.stats.pages_retired.fetch_add(n, Ordering::Relaxed);
                        tracing::debug!(pages = n, "a replaced version's pages left to the cache")
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "leaving a replaced version's pages to the cache")
                    }
                }
            }
        }
        let mut paths: Vec<String> = Vec::new();
        for p in &applied.taken {
            paths.push(p.clone());
            let mut cur = p.as_str();
            while let Some(parent) = pagestore_protocol::writeback::parent(cur) {
                paths.push(parent.to_string());
                cur = parent;
            }
        }
        paths.sort();
        paths.dedup();
        if let Err(e) = node.forget_paths(paths).await {
            tracing::warn!(error = %e, "forgetting cached metadata");
        }
    }

    /// Hands `records` (already kept here) to every other node; succeeds once `need` of them
    /// hold them (and every other one has answered or failed).
    async fn hand_on(&self, records: &[FileRecord], need: usize) -> Result<(), SourceError> {
        let others = self.other_nodes();
        if others.is_empty() {
            return if need == 0 {
                Ok(())
            } else {
                Err(SourceError::new(
                    ErrorCode::Unavailable,
                    format!("the change needs {need} more node(s) and this node knows no peer"),
                ))
            };
        }
        let Some(client) = self.peers() else {
            return Err(SourceError::new(
                ErrorCode::Unavailable,
                "this node is not connected to its peers yet",
            ));
        };
        let payload = Bytes::from(encode_file_records(records).map_err(store_error)?);
        let others: Vec<_> = others.iter().map(|&(_, addr)| addr).collect();
        let request = (&RequestBody::Replicate, payload);
        let (held, failures) =
            ask_peers(client, &others, request, need, Wait::All, |_, r| match r? {
                (ResponseBody::Applied { .. }, _) => Ok(()),
                (other, _) => Err(format!("{other:?}")),
            })
            .await;
        let held = held.len();
        if held >= need {
            if !failures.is_empty() {
                tracing::warn!(failures = ?failures, "some nodes did not take a change; they catch up by pulling");
            }
            return Ok(());
        }
        Err(SourceError::new(
            ErrorCode::Unavailable,
            format!(
                "only {held} other node(s) hold the change, {need} needed: {}",
                failures.join("; ")
            ),
        ))
    }

    /// Stamps `records` as this node's change now, keeps them and hands them on; the change
    /// holds once the write replicas do. Returns its position.
    async fn commit_change(&self, mut records: Vec<FileRecord>) -> Result<u64, SourceError> {
        let hlc = self.hlc.now();
        for r in &mut records {
            r.hlc = hlc;
            r.origin = FileId::from_u128(self.me);
        }
        self.keep(records.clone(), true).await?;
        self.hand_on(&records, self.replicas() - 1).await?;
        Ok(hlc)
    }

    /// Keeps a step of an existing change (a seal, a flush, a deletion applied) and hands it to
    /// every node that answers. Returns whether this node took it (a later change of the path
    /// may have superseded it).
    async fn step(&self, record: FileRecord) -> Result<bool, SourceError> {
        let applied = self.keep(vec![record.clone()], true).await?;
        if applied.taken.is_empty() {
            return Ok(false);
        }
        // Nodes that miss it catch up by pulling; the step is already durable here.
        let _ = self.hand_on(std::slice::from_ref(&record), 0).await;
        Ok(true)
    }

    /// A client's change (see [`Records::plan`]), with what only the under storage knows
    /// checked here.
    async fn plan_and_commit(&self, op: ChangeOp) -> Result<u64, SourceError> {
        let named = named_paths(&op);
        for p in &named {
            check_change_path(p).map_err(|e| SourceError::new(ErrorCode::BadRequest, e))?;
        }
        let path = named[0].to_string();
        let table = self.ufs.table();
        if table.mount_of(&path).is_none() {
            return Err(SourceError::new(
                ErrorCode::BadRequest,
                format!("{path}: no mount of this node holds it"),
            ));
        }
        let policy = table.write_policy(&path);
        if !policy.is_cached() {
            return Err(SourceError::new(
                ErrorCode::BadRequest,
                format!(
                    "{path}: its mount writes through to the under storage (write=through); \
                     mount it with write=back or write=transient to write through the cluster"
                ),
            ));
        }
        if let ChangeOp::Rename { to, .. } = &op {
            if table.mount_of(to) != table.mount_of(&path) {
                return Err(SourceError::new(
                    ErrorCode::BadRequest,
                    format!("{path} -> {to}: a rename stays within one mount"),
                ));
            }
        }
        let transient = policy == pagestore_protocol::writeback::WritePolicy::Transient;
        self.gather(&op).await?;
        let _one = self.change_lock.lock().await;
        let keep = self.settings.keep_records.as_millis() as u64;
        let plan = {
            let t = self.table();
            t.refuse_forgotten(&op, self.hlc.now_ms(), keep)
                .and_then(|()| t.plan(&op, transient))
                .map_err(refused)?
        };
        let records = match plan {
            Plan::Nothing => {
                // A position still: a writer's later commits send it as `since`.
                let at = self.table().get(&path).map(|r| r.hlc);
                return Ok(at.unwrap_or_else(|| self.hlc.now()));
            }
            Plan::Records(records) => {
                self.check_store(&op).await?;
                records
            }
            Plan::CopyInStore { from, to } => self.store_rename(&op, &from, &to).await?,
        };
        let records = self
            .table()
            .with_parent_times(records, pagestore_protocol::writeback::unix_ns());
        self.commit_change(records).await
    }

    /// Asks every other node for its records of the paths `op` touches (and their ancestors)
    /// and keeps those that rank higher than this node's, so that the change is judged on the
    /// path as the cluster holds it, not as this node does: a node that missed a change's
    /// `Replicate` (down, frozen or not yet told of the committing node at the time) learns it
    /// here, before the periodic pull. A change is acknowledged once `replicas` nodes hold it,
    /// so this node and any `nodes - replicas` others hold every acknowledged record of the
    /// paths: a change whose outcome depends on what the path holds ([`judged`]) needs that
    /// many answers. Every change needs `replicas - 1` (the nodes that are to hold it with this
    /// one). Fewer: `Unavailable` (the client tries again), and nothing is kept.
    async fn gather(&self, op: &ChangeOp) -> Result<(), SourceError> {
        let paths = touched_paths(op);
        let replicas = self.replicas();
        let to_hold = replicas - 1;
        let to_judge = if judged(op) {
            self.nodes().saturating_sub(replicas)
        } else {
            0
        };
        let needed = to_hold.max(to_judge);
        let Some((answered, failures)) = self
            .take_peers_records(&paths, needed, Wait::All, "judging a change of them")
            .await?
        else {
            return Ok(());
        };
        // A change no write set can take now is refused before it is stamped and kept: kept
        // here alone, never acknowledged, it could still rank above a later acknowledged
        // change of the path once this node is back among the others.
        if answered < needed {
            let why = if answered < to_hold {
                format!("{to_hold} needed to hold the change ({replicas} write replicas)")
            } else {
                format!("{to_judge} needed to judge a conditional change")
            };
            return Err(SourceError::new(
                ErrorCode::Unavailable,
                format!(
                    "{}: {answered} other node(s) answered, {why}: {}",
                    paths[0],
                    failures.join("; ")
                ),
            ));
        }
        if !failures.is_empty() {
            tracing::debug!(failures = ?failures, "some nodes did not tell their records of a change's paths");
        }
        Ok(())
    }

    /// Asks the other nodes for their records of `paths` (a peer answers each path's record
    /// and the first live record beneath it: `records_of`) and keeps those that rank higher
    /// than this node's (`why`: what for, logged with what this node had missed); then, for
    /// each path (not an ancestor asked with it) beneath which this node's first live record
    /// is not one that every peer that answered gave, confirms its live records there
    /// ([`WriteBackNode::confirm_beneath`]), so that a node that missed the deletions of a
    /// directory's files does not take the directory for one. Returns how many answered and
    /// why the others did not; `None` when this node has no peer to ask.
    async fn take_peers_records(
        &self,
        paths: &[String],
        need: usize,
        wait: Wait,
        why: &str,
    ) -> Result<Option<(usize, Vec<String>)>, SourceError> {
        let Some((told, failures)) = self.records_from_peers(paths, need, wait, why).await? else {
            return Ok(None);
        };
        if need > 0 && told.len() >= need {
            // The paths themselves, not the ancestors asked with them: what is beneath an
            // ancestor that a deleted directory alone implied is beneath the path too.
            let leaves = paths
                .iter()
                .filter(|p| !paths.iter().any(|q| beneath(p, q)))
                .cloned();
            let doubted = self.doubted(leaves, &told);
            self.confirm_beneath(doubted, need, why).await?;
        }
        Ok(Some((told.len(), failures)))
    }

    /// [`WriteBackNode::take_peers_records`] without the confirmation: what each peer that
    /// answered gave, and why the others did not.
    async fn records_from_peers(
        &self,
        paths: &[String],
        need: usize,
        wait: Wait,
        why: &str,
    ) -> Result<Option<(Vec<Told>, Vec<String>)>, SourceError> {
        let others = self.other_nodes();
        let Some(client) = self.peers().filter(|_| !others.is_empty()) else {
            return Ok(None);
        };
        let body = RequestBody::RecordsOf {
            paths: paths.to_vec(),
        };
        let others = rotated(others.iter().map(|&(_, addr)| addr).collect(), wait);
        let request = (&body, Bytes::new());
        let (answers, failures) =
            ask_peers(client, &others, request, need, wait, |_, r| records_page(r)).await;
        let told: Vec<Told> = answers.iter().map(|(v, _)| told_of(v)).collect();
        let mut records: Vec<FileRecord> = answers.into_iter().flat_map(|(v, _)| v).collect();
        // Only what was asked for: records of the paths and beneath them (the root's beneath
        // is everything, but a peer answers one record beneath each path).
        records.retain(|r| paths.iter().any(|p| r.path == *p || beneath(p, &r.path)));
        self.take_records(records, why).await?;
        Ok(Some((told, failures)))
    }

    /// Of `dirs`, those beneath which this node's first live record is not one that every
    /// peer in `told` gave (at its rank): a peer that holds it live gives it, or gives one
    /// before it that this node took; one that holds its deletion gives neither.
    fn doubted(&self, dirs: impl IntoIterator<Item = String>, told: &[Told]) -> Vec<String> {
        let t = self.table();
        dirs.into_iter()
            .filter(|d| t.first_beneath(d).is_some_and(|r| !told_by_all(told, r)))
            .collect()
    }

    /// Asks `need` peers for their records of this node's live records beneath each of `dirs`
    /// (the first ones of each, [`MAX_RECORDS_OF`] paths a round) and keeps those that rank
    /// higher, until the first live record beneath each is one the peers were asked of and
    /// did not delete, or none is left: a directory whose files the cluster deleted while
    /// this node was frozen (or backed off) is then no directory here either. At most
    /// [`CONFIRM_ROUNDS`] rounds; the periodic pull settles what is left.
    async fn confirm_beneath(
        &self,
        mut dirs: Vec<String>,
        need: usize,
        why: &str,
    ) -> Result<(), SourceError> {
        for _ in 0..CONFIRM_ROUNDS {
            let asked: Vec<String> = {
                let t = self.table();
                let each = (MAX_RECORDS_OF / dirs.len().max(1)).max(1);
                let mut asked: Vec<String> = dirs
                    .iter()
                    .flat_map(|d| t.live_beneath(d).take(each))
                    .map(|r| r.path.clone())
                    .collect();
                asked.sort_unstable();
                asked.dedup();
                asked.truncate(MAX_RECORDS_OF);
                asked
            };
            if asked.is_empty() {
                return Ok(());
            }
            self.stats.confirm_rounds.fetch_add(1, Ordering::Relaxed);
            let answered = self
                .records_from_peers(&asked, need, Wait::Need, why)
                .await?
                .map_or(0, |(told, _)| told.len());
            if answered < need {
                tracing::debug!(dirs = ?dirs, answered, need, "too few peers told their records beneath directories to confirm them");
                return Ok(());
            }
            let t = self.table();
            dirs.retain(|d| {
                t.first_beneath(d)
                    .is_some_and(|r| asked.binary_search(&r.path).is_err())
            });
            if dirs.is_empty() {
                return Ok(());
            }
        }
        tracing::debug!(dirs = ?dirs, "live records beneath directories left unconfirmed after {CONFIRM_ROUNDS} rounds; the pull settles them");
        Ok(())
    }

    /// Keeps those of the peers' `records` that rank higher than this node's, and counts and
    /// logs the paths taken (`why`: what they were asked for).
    async fn take_records(&self, records: Vec<FileRecord>, why: &str) -> Result<(), SourceError> {
        if records.is_empty() {
            return Ok(());
        }
        let applied = self.keep(records, false).await?;
        if !applied.taken.is_empty() {
            self.stats
                .caught_up
                .fetch_add(applied.taken.len() as u64, Ordering::Relaxed);
            tracing::info!(
                paths = ?applied.taken,
                "took records of paths from the peers before {why} (this node had missed them)"
            );
        }
        Ok(())
    }

    /// The peers whose records a stat takes first ([`WriteBackNode::catch_up_for_read`]):
    /// `nodes - write_replicas` (0 when every node is a write replica, or there is no peer).
    pub(crate) fn peers_for_reads(&self) -> usize {
        if self.peers().is_none() {
            return 0;
        }
        self.nodes().saturating_sub(self.replicas())
    }

    /// Before a stat of `path` (of a `back` or `transient` mount) is answered: takes the
    /// records of the path and its ancestors that `nodes - write_replicas` peers hold, so
    /// that a node that missed a change's `Replicate` (frozen, or backed off by the node that
    /// took the change) answers what the cluster acknowledged: a change is acknowledged once
    /// `write_replicas` nodes hold it, so this node and that many peers overlap every write
    /// set. Waits for that many answers only. With fewer, the node answers from what it has
    /// (the periodic pull catches it up later).
    pub(crate) async fn catch_up_for_read(&self, path: &str) {
        let need = self.peers_for_reads();
        if need == 0 {
            return;
        }
        let paths = with_ancestors(&[path]);
        match self
            .take_peers_records(&paths, need, Wait::Need, "answering a stat")
            .await
        {
            Ok(Some((answered, failures))) if answered < need => tracing::debug!(
                %path,
                answered,
                need,
                failures = ?failures,
                "too few peers told their records of a path before a stat; answered from this node's"
            ),
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(%path, error = %e, "keeping the peers' records of a path before a stat")
            }
        }
    }

    /// Before a listing of directory `dir` (of a `back` or `transient` mount) is answered:
    /// takes the records of its entries that `nodes - write_replicas` peers hold
    /// (`RecordsIn`, every page of each), as a stat takes the records of its path
    /// ([`WriteBackNode::catch_up_for_read`]), so a node that missed a change in `dir` lists
    /// what the cluster acknowledged; then confirms the live records beneath each entry that
    /// they make a directory where a peer did not give the same first one
    /// ([`WriteBackNode::confirm_beneath`]: a peer that holds only deletions beneath an entry
    /// gives nothing of it). With fewer answers, the node lists from what it has.
    pub(crate) async fn catch_up_for_listing(&self, dir: &str) {
        let need = self.peers_for_reads();
        let others = self.other_nodes();
        let Some(client) = self.peers().filter(|_| need > 0 && !others.is_empty()) else {
            return;
        };
        let others = rotated(others.iter().map(|&(_, addr)| addr).collect(), Wait::Need);
        let ask = |after: String, digest: u64| RequestBody::RecordsIn {
            dir: dir.to_string(),
            after,
            digest,
        };
        // A peer that holds the same records of the directory answers `Same`.
        let first = ask(String::new(), self.table().digest_in(dir, ""));
        let (answers, mut failures) = ask_peers(
            client,
            &others,
            (&first, Bytes::new()),
            need,
            Wait::Need,
            |addr, r| match r {
                Ok((ResponseBody::Same, _)) => Ok((addr, None)),
                r => records_page(r).map(|page| (addr, Some(page))),
            },
        )
        .await;
        let answered = answers.len();
        // What each peer that does not hold the same gave, every page together.
        let mut told: Vec<Told> = Vec::new();
        for (addr, (mut page, mut more)) in answers
            .into_iter()
            .filter_map(|(addr, page)| Some((addr, page?)))
        {
            // Each page is kept as it comes: a directory's records are not all held at once.
            let mut after = String::new();
            let mut given = Told::new();
            loop {
                page.retain(|r| beneath(dir, &r.path));
                given.extend(told_of(&page));
                let last = page.last().and_then(|r| entry_name(dir, &r.path));
                // Pages go forward: one that does not is the last asked.
                let next = last
                    .filter(|&l| more && l > after.as_str())
                    .map(str::to_string);
                if let Err(e) = self.take_records(page, "listing their directory").await {
                    tracing::debug!(%dir, error = %e, "keeping the peers' records of a directory before a listing");
                    return;
                }
                let Some(next) = next else {
                    break;
                };
                after = next;
                let r = client.call(addr, ask(after.clone(), 0), Bytes::new()).await;
                match records_page(r.map_err(|e| e.to_string())) {
                    Ok(p) => (page, more) = p,
                    Err(why) => {
                        failures.push(format!("{addr}: {why}"));
                        break;
                    }
                }
            }
            told.push(given);
        }
        if answered < need || !failures.is_empty() {
            tracing::debug!(
                %dir,
                answered,
                need,
                failures = ?failures,
                "not every peer asked told all its records of a directory before a listing; listed with what this node has"
            );
        }
        if answered >= need && !told.is_empty() {
            let entries = self.table().implied_entries(dir);
            let doubted = self.doubted(entries, &told);
            if let Err(e) = self
                .confirm_beneath(doubted, need, "listing their directory")
                .await
            {
                tracing::debug!(%dir, error = %e, "keeping the peers' records beneath a directory's entries before a listing");
            }
        }
    }

    /// The checks of a planned change that only the under storage can answer, for paths the
    /// records know nothing of.
    async fn check_store(&self, op: &ChangeOp) -> Result<(), SourceError> {
        let unknown = |p: &str| matches!(self.table().known(p), records::Known::Unknown);
        let stat = |p: String| {
            let ufs = self.ufs.clone();
            async move {
                match ufs.table().stat_path(&p).await {
                    Ok(k) => Ok(Some(k)),
                    Err(UfsError::NotFound(_)) => Ok(None),
                    Err(e) => Err(store_error(e)),
                }
            }
        };
        // The nearest ancestor that exists of a path a change makes must be a directory: a
        // file of the store cannot hold one, and the flush could never write it.
        let made = match op {
            ChangeOp::Commit { path, .. } | ChangeOp::MakeDir { path, .. } if unknown(path) => {
                Some(path.as_str())
            }
            ChangeOp::Rename { to, .. } => Some(to.as_str()),
            _ => None,
        };
        let mut cur = made.and_then(pagestore_protocol::writeback::parent);
        while let Some(a) = cur {
            if !unknown(a) {
                // The records decided (Records::file_ancestor).
                break;
            }
            match stat(a.to_string()).await {
                Ok(Some(PathKind::File { .. })) => {
                    return Err(SourceError::new(
                        ErrorCode::NotDir,
                        pagestore_protocol::writeback::beneath_file(made.unwrap_or_default(), a),
                    ))
                }
                Ok(None) => cur = pagestore_protocol::writeback::parent(a),
                // A directory, or a store that does not answer now.
                _ => break,
            }
        }
        // A conditional commit of a path the records do not know: the store's object decides
        // (and a store that does not answer fails the commit: nothing is guessed).
        if let ChangeOp::Commit {
            path,
            version_tag,
            expect,
            ..
        } = op
        {
            let first = self.table().by_file(version_id(version_tag)).is_none();
            if *expect != Expect::Any && first && unknown(path) {
                store_meets(path, expect, stat(path.clone()).await?.as_ref())?;
            }
        }
        match op {
            // Writes go on while the store is down: these checks are made when it answers.
            ChangeOp::Commit { path, .. } if unknown(path) => {
                if let Ok(Some(PathKind::Dir { .. })) = stat(path.clone()).await {
                    return Err(SourceError::new(
                        ErrorCode::IsDir,
                        format!("{path}: is a directory"),
                    ));
                }
            }
            ChangeOp::MakeDir { path, .. } if unknown(path) => {
                if let Ok(Some(_)) = stat(path.clone()).await {
                    return Err(SourceError::new(
                        ErrorCode::Exists,
                        format!("{path}: already exists"),
                    ));
                }
            }
            ChangeOp::Delete { path, dir, expect } if unknown(path) => {
                let found = stat(path.clone()).await?;
                store_meets(path, expect, found.as_ref())?;
                match (found, dir) {
                    (None, _) => {
                        return Err(SourceError::new(
                            ErrorCode::NotFound,
                            format!("{path}: no such file or directory"),
                        ))
                    }
                    (Some(PathKind::Dir { .. }), false) => {
                        return Err(SourceError::new(
                            ErrorCode::IsDir,
                            format!("{path}: is a directory"),
                        ))
                    }
                    (Some(PathKind::File { .. }), true) => {
                        return Err(SourceError::new(
                            ErrorCode::NotDir,
                            format!("{path}: not a directory"),
                        ))
                    }
                    // A directory of the store holds an object (it would not exist otherwise).
                    (Some(PathKind::Dir { .. }), true) => {
                        return Err(SourceError::new(
                            ErrorCode::NotEmpty,
                            format!("{path}: directory not empty"),
                        ))
                    }
                    (Some(PathKind::File { .. }), false) => {}
                }
            }
            ChangeOp::Delete {
                path, dir: true, ..
            } => {
                // A directory made through the cluster: the store may hold objects beneath it
                // that no record deletes.
                match self.ufs.table().list_entries(path).await {
                    Ok(v) => {
                        let t = self.table();
                        let live = v.iter().any(|e| {
                            let p = format!("{}/{}", path.trim_end_matches('/'), e.name);
                            !matches!(
                                t.get(&p).map(|r| &r.entry),
                                Some(RecordEntry::Deleted { .. })
                            )
                        });
                        if live {
                            return Err(SourceError::new(
                                ErrorCode::NotEmpty,
                                format!("{path}: directory not empty"),
                            ));
                        }
                    }
                    Err(UfsError::NotFound(_)) => {}
                    Err(e) => return Err(store_error(e)),
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// A rename whose source the store holds: copied in the store first, then recorded.
    async fn store_rename(
        &self,
        op: &ChangeOp,
        from: &str,
        to: &str,
    ) -> Result<Vec<FileRecord>, SourceError> {
        let ChangeOp::Rename { replace, .. } = op else {
            return Err(SourceError::new(ErrorCode::Internal, "not a rename"));
        };
        let table = self.ufs.table();
        match table.stat_path(from).await {
            Ok(PathKind::File { .. }) => {}
            Ok(PathKind::Dir { .. }) => {
                return Err(SourceError::new(
                    ErrorCode::BadRequest,
                    format!("{from}: renaming directories is not supported"),
                ))
            }
            Err(UfsError::NotFound(_)) => {
                return Err(SourceError::new(
                    ErrorCode::NotFound,
                    format!("{from}: no such file"),
                ))
            }
            Err(e) => return Err(store_error(e)),
        }
        if !*replace && matches!(self.table().known(to), records::Known::Unknown) {
            match table.stat_path(to).await {
                Ok(_) => {
                    return Err(SourceError::new(
                        ErrorCode::Exists,
                        format!("{to}: already exists"),
                    ))
                }
                Err(UfsError::NotFound(_)) => {}
                Err(e) => return Err(store_error(e)),
            }
        }
        table.copy(from, to).await.map_err(store_error)?;
        let copied = table.stat(to).await.map_err(store_error)?;
        Ok(self.table().plan_store_rename(
            from,
            to,
            &copied.version,
            (copied.size, copied.mtime_ns),
            &fresh_tag(),
        ))
    }

    // -- flushing -------------------------------------------------------------------------

    /// Whether this node flushes `path`: the first node of the path's successors on the ring
    /// that this node believes alive.
    fn is_flusher(&self, path: &str) -> bool {
        let Some(c) = self.peers() else {
            return self.initial_nodes <= 1;
        };
        let m = c.membership();
        let down = c.down_members();
        let ring = m.ring();
        for member in ring.replicas_of_hash(path_hash(path), usize::MAX) {
            if down.contains(&member.node) {
                continue;
            }
            if member.node == self.me {
                return true;
            }
            let alive = m
                .nodes()
                .find(|n| n.id == member.node)
                .is_some_and(|n| c.reachable(n.shard_addr(0)));
            if alive {
                return false;
            }
        }
        true
    }

    async fn flush_loop(self: Arc<Self>) {
        loop {
            let _ = tokio::time::timeout(Duration::from_millis(500), self.wake.notified()).await;
            self.flush_round();
        }
    }

    /// Starts flushes of the records this node flushes, in order, up to the parallelism and
    /// within the memory the flushes may hold (a record that does not fit waits, and so do
    /// the ones after it).
    fn flush_round(self: &Arc<Self>) {
        let now = self.hlc.now_ms();
        let lease = self.settings.lease.as_millis() as u64;
        let work: Vec<FileRecord> = self
            .table()
            .flushable(now, lease)
            .into_iter()
            .cloned()
            .collect();
        for rec in work {
            if !self.is_flusher(&rec.path) {
                continue;
            }
            {
                let b = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
                if b.get(&rec.path)
                    .is_some_and(|(until, _)| Instant::now() < *until)
                {
                    continue;
                }
            }
            {
                let mut f = self.flushing.lock().unwrap_or_else(|p| p.into_inner());
                if f.contains_key(&rec.path) {
                    continue;
                }
                let cost = match &rec.entry {
                    RecordEntry::File { size, .. } => self.settings.flush_cost(*size),
                    _ => 0,
                };
                if !self.settings.may_start(f.len(), f.values().sum(), cost) {
                    return;
                }
                f.insert(rec.path.clone(), cost);
            }
            let me = self.clone();
            tokio::spawn(async move {
                me.stats.flushing.fetch_add(1, Ordering::Relaxed);
                let path = rec.path.clone();
                let r = me.flush_one(rec).await;
                me.stats.flushing.fetch_sub(1, Ordering::Relaxed);
                me.flushing
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&path);
                let mut b = me.backoff.lock().unwrap_or_else(|p| p.into_inner());
                match r {
                    Ok(()) => {
                        b.remove(&path);
                        me.wake.notify_one();
                    }
                    Err(e) => {
                        me.stats.errors.fetch_add(1, Ordering::Relaxed);
                        let next = b.get(&path).map_or(Duration::from_secs(1), |(_, d)| {
                            (*d * 2).min(MAX_FLUSH_BACKOFF)
                        });
                        tracing::warn!(%path, error = %e, retry_in = ?next, "flush failed; the data stays on the cluster");
                        *me.last_error.lock().unwrap_or_else(|p| p.into_inner()) =
                            format!("{path}: {e}");
                        b.insert(path, (Instant::now() + next, next));
                    }
                }
            });
        }
    }

    /// One step of a record's way to the under storage.
    async fn flush_one(&self, rec: FileRecord) -> Result<(), SourceError> {
        match &rec.entry {
            RecordEntry::File {
                state: RecordState::Open,
                ..
            } => {
                let mut sealed = rec.clone();
                if let RecordEntry::File { state, .. } = &mut sealed.entry {
                    *state = RecordState::Sealed;
                }
                tracing::info!(path = %rec.path, "sealing a version whose writer went silent");
                // Every node that takes the seal fences the version's puts in progress first.
                if self.step(sealed).await? {
                    self.stats.seals.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            }
            RecordEntry::File {
                version_tag,
                size,
                attrs,
                ..
            } => {
                let store_tag = self.upload(&rec.path, version_tag, *size, attrs).await?;
                // The record as it is now if it still names the version and waits for its
                // flush: a change of the file's time meanwhile (`SetTime`) leaves the bytes as
                // they were, and its flush is this one.
                let mut clean = match self.table().get(&rec.path) {
                    Some(now) if waits_for_flush(now, version_tag) => now.clone(),
                    _ => rec.clone(),
                };
                if let RecordEntry::File {
                    state,
                    store_tag: st,
                    ..
                } = &mut clean.entry
                {
                    *state = RecordState::Clean;
                    *st = store_tag;
                }
                if self.step(clean).await? {
                    self.stats.files.fetch_add(1, Ordering::Relaxed);
                    self.stats.bytes.fetch_add(*size, Ordering::Relaxed);
                    // The other nodes mark their pages clean as they take the record; tell
                    // them again for those that missed it.
                    self.broadcast_pages(version_id(version_tag), PageAction::Clean)
                        .await;
                }
                Ok(())
            }
            RecordEntry::Deleted {
                prev_tag,
                pending: true,
            } => {
                match self.ufs.table().delete(&rec.path).await {
                    Ok(()) | Err(UfsError::NotFound(_)) => {}
                    Err(e) => return Err(store_error(e)),
                }
                let done = FileRecord {
                    entry: RecordEntry::Deleted {
                        prev_tag: prev_tag.clone(),
                        pending: false,
                    },
                    ..rec.clone()
                };
                if self.step(done).await? {
                    self.stats.deletes.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Tells every shard of every node to do `action` to a version's pages (best effort).
    async fn broadcast_pages(&self, id: u128, action: PageAction) {
        let Some(c) = self.peers() else {
            return;
        };
        let m = c.membership();
        let asks: Vec<_> = m
            .nodes()
            .filter(|n| n.id != self.me)
            .flat_map(|n| (0..n.shards).map(move |s| n.shard_addr(s)))
            .map(|addr| {
                c.call(
                    addr,
                    RequestBody::FilePages {
                        file_id: FileId::from_u128(id),
                        action,
                    },
                    Bytes::new(),
                )
            })
            .collect();
        futures_util::future::join_all(asks).await;
    }

    /// Writes version `tag` (`size` bytes) of `path` to the store with its attributes
    /// `attrs`, reading it from the cluster; the store's version of the object written.
    async fn upload(
        &self,
        path: &str,
        tag: &str,
        size: u64,
        attrs: &[Attr],
    ) -> Result<String, SourceError> {
        let Some(client) = self.peers() else {
            return Err(SourceError::new(
                ErrorCode::Unavailable,
                "not connected to the cluster yet",
            ));
        };
        let info = ObjectInfo {
            path: path.to_string(),
            size,
            version: tag.to_string(),
            file_id: version_id(tag),
            mtime_ns: 0,
            state: FileState::Dirty,
            store_tag: String::new(),
        };
        let table = self.ufs.table();
        let attributes = ufs::store_attributes(attrs);
        let part = self.settings.part();
        let read = |at: u64| {
            let info = &info;
            async move {
                let want = part.min(size - at);
                let b = client.read_at(info, at, want).await.map_err(|e| {
                    SourceError::new(
                        ErrorCode::Unavailable,
                        format!("reading {path} from the cluster: {e}"),
                    )
                })?;
                if b.len() as u64 != want {
                    return Err(SourceError::new(
                        ErrorCode::Internal,
                        format!(
                            "{path}: read {} bytes at {at} from the cluster, {want} expected",
                            b.len()
                        ),
                    ));
                }
                Ok::<Bytes, SourceError>(b)
            }
        };
        // Only one flush of a version reaches the store: two nodes may both take themselves
        // for the path's flusher for a moment (around a node's death or return), and the
        // second write would leave the store an object whose version the records do not name
        // (readers of pages no node holds would then find the object "changed"). So the write
        // is conditional on the object the flusher saw first, where the store can do it.
        let mode = match table.stat(path).await {
            Ok(prev) => object_store::PutMode::Update(object_store::UpdateVersion {
                e_tag: Some(format!("\"{}\"", prev.version)),
                version: None,
            }),
            Err(UfsError::NotFound(_)) => object_store::PutMode::Create,
            Err(e) => return Err(store_error(e)),
        };
        let mut conditional = true;
        let written = if size <= part {
            let data = if size == 0 {
                Bytes::new()
            } else {
                read(0).await?
            };
            let outcome = match table
                .put_if(path, data.clone(), mode, attributes.clone())
                .await
            {
                // A store that cannot write conditionally (or would not now): written as
                // before, and checked below.
                Err(e @ UfsError::Store(..)) => {
                    tracing::debug!(path, error = %e, "conditional flush refused; writing it plainly");
                    conditional = false;
                    table
                        .put_if(path, data, object_store::PutMode::Overwrite, attributes)
                        .await
                }
                other => other,
            };
            match outcome.map_err(store_error)? {
                PutOutcome::Written(v) => v,
                PutOutcome::ConditionFailed => return Err(raced(path)),
            }
        } else {
            let mut upload = match table
                .put_multipart_if(path, mode.clone(), attributes.clone())
                .await
            {
                Err(e @ UfsError::Store(..)) => {
                    tracing::debug!(path, error = %e, "conditional flush refused; writing it plainly");
                    conditional = false;
                    table
                        .put_multipart_if(path, object_store::PutMode::Overwrite, attributes)
                        .await
                }
                other => other,
            }
            .map_err(store_error)?;
            // Each part runs on its own (`PartUploads`): the next part is read from the cluster
            // while the store takes the ones before it, so at most `FLUSH_PARTS` + 1 parts of a
            // file are held at once. Dropping the set on an error aborts the rest.
            let mut parts = PartUploads::new(FLUSH_PARTS);
            let mut at = 0;
            let result: Result<(), SourceError> = async {
                while at < size {
                    let b = read(at).await?;
                    at += b.len() as u64;
                    parts
                        .start(upload.put_part(b.into()))
                        .await
                        .map_err(store_error)?;
                }
                parts.finish().await.map_err(store_error)
            }
            .await;
            drop(parts);
            // A store that cannot complete the upload conditionally: just before the object
            // appears, the path must still name this version and the store still hold what
            // the flush found, else another flush (or a newer version's) came meanwhile and
            // this one would overwrite it. That leaves the moment between this check and the
            // completion, not the whole upload, to a flusher racing this one.
            let result = match result {
                Ok(()) if !conditional => {
                    let found = match table.stat(path).await {
                        Ok(now) => Some(now.version),
                        Err(UfsError::NotFound(_)) => None,
                        Err(e) => return Err(store_error(e)),
                    };
                    still_current(path, tag, self.table().get(path), &mode, found.as_deref())
                }
                other => other,
            };
            if let Err(e) = result {
                let _ = upload.abort().await;
                return Err(e);
            }
            match upload.complete().await {
                Ok(r) => pagestore_mounts::ufs::written_version(&r),
                Err(
                    object_store::Error::Precondition { .. }
                    | object_store::Error::AlreadyExists { .. },
                ) => return Err(raced(path)),
                Err(e) => return Err(store_error(UfsError::Store(path.to_string(), e))),
            }
        };
        match written {
            Some(v) if conditional => Ok(v),
            // Written plainly: the version is kept only if no other write came after it.
            Some(v) => {
                let now = table.stat(path).await.map_err(store_error)?.version;
                if v == now {
                    Ok(v)
                } else {
                    Err(raced(path))
                }
            }
            None => Ok(table.stat(path).await.map_err(store_error)?.version),
        }
    }

    // -- keeping in step ------------------------------------------------------------------

    /// Pulls every record from the other nodes (`all`, at start: all of them at once, each
    /// asked again for up to 15 s while it does not answer) or from one of them, and takes what
    /// ranks higher than ours. At start, once enough peers gave all their records that every
    /// change acknowledged while this node was down is among them (as many as judge a
    /// conditional change, at least one), the node answers from its records again
    /// ([`WriteBackNode::catching_up`]); the pull goes on with the others.
    async fn pull_all(&self, all: bool) {
        let Some(client) = self.peers().cloned() else {
            return;
        };
        let mut others = self.other_nodes();
        if !all {
            let k = (unix_ms() as usize) % others.len().max(1);
            others.rotate_left(k);
            others.truncate(1);
        }
        // A change acknowledged while this node was down is held by `replicas` of the others:
        // any `nodes - replicas` of them include one that holds it.
        let enough = self
            .nodes()
            .saturating_sub(self.replicas())
            .max(1)
            .min(others.len());
        let complete = std::sync::atomic::AtomicUsize::new(0);
        if all && enough == 0 {
            self.pulled_at_start.store(true, Ordering::Release);
        }
        let started = Instant::now();
        let pulls = others.iter().map(|&(_, addr)| {
            let (client, complete) = (&client, &complete);
            async move {
                if self.pull_from(client, addr, all, started).await
                    && all
                    && complete.fetch_add(1, Ordering::AcqRel) + 1 >= enough
                {
                    self.pulled_at_start.store(true, Ordering::Release);
                }
            }
        });
        futures_util::future::join_all(pulls).await;
        self.stats.pulls.fetch_add(1, Ordering::Relaxed);
    }

    /// Pulls every record of the peer at `addr` (`at_start`: asking again until 15 s after
    /// `started` while it does not answer; peers that are starting too, or whose connection is
    /// not up yet, answer a moment later, and a node that flushed what it took for dirty before
    /// it heard of the peers' flushes would upload the file a second time). Whether the peer
    /// gave all its records.
    async fn pull_from(
        &self,
        client: &Client,
        addr: SocketAddr,
        at_start: bool,
        started: Instant,
    ) -> bool {
        /// How long a starting node keeps asking a peer that does not answer for its records.
        const START_PULL_WAIT: Duration = Duration::from_secs(15);
        let mut after = String::new();
        loop {
            let body = RequestBody::PullRecords {
                after: after.clone(),
            };
            let mut answer = client.call(addr, body.clone(), Bytes::new()).await;
            while at_start && answer.is_err() && started.elapsed() < START_PULL_WAIT {
                tokio::time::sleep(Duration::from_millis(250)).await;
                answer = client.call(addr, body.clone(), Bytes::new()).await;
            }
            let (more, records) = match answer {
                Ok((ResponseBody::Records { more }, payload)) => {
                    match pagestore_protocol::frame::decode_file_records(&payload) {
                        Ok(r) => (more, r),
                        Err(e) => {
                            tracing::warn!(%addr, error = %e, "a peer's records are malformed");
                            return false;
                        }
                    }
                }
                Ok(_) | Err(_) => return false,
            };
            let Some(last) = records.last().map(|r| r.path.clone()) else {
                return true;
            };
            match self.keep(records, false).await {
                Ok(applied) => {
                    self.stats
                        .pulled
                        .fetch_add(applied.taken.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::warn!(%addr, error = %e, "keeping a peer's records");
                    return false;
                }
            }
            if !more {
                return true;
            }
            after = last;
        }
    }

    async fn sync_loop(self: Arc<Self>) {
        let (mut last_pull, mut last_reconcile) = (Instant::now(), Instant::now());
        // A gone writer's pages are dropped within a quarter of the grace after it ends.
        let reconcile_every = self
            .settings
            .sync_interval
            .min(self.settings.orphan_grace / 4);
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            self.ping_peers().await;
            self.forget_settled();
            if last_pull.elapsed() >= self.settings.sync_interval {
                last_pull = Instant::now();
                self.pull_all(false).await;
            }
            if last_reconcile.elapsed() >= reconcile_every {
                last_reconcile = Instant::now();
                self.reconcile().await;
            }
        }
    }

    /// Keeps this node's view of which peers are alive fresh (the flusher of a path is the first
    /// live node of its successors).
    async fn ping_peers(&self) {
        let Some(client) = self.peers() else {
            return;
        };
        let asks: Vec<_> = self
            .other_nodes()
            .into_iter()
            .map(|(_, addr)| client.call(addr, RequestBody::Ping { nonce: 1 }, Bytes::new()))
            .collect();
        futures_util::future::join_all(asks).await;
    }

    /// Checks this node's dirty pages against the records: flushed versions become clean,
    /// versions no record holds (after the grace period) are dropped; forgets old deletions
    /// and compacts the journal.
    async fn reconcile(&self) {
        let Some(node) = self.node() else {
            return;
        };
        // Dirty pages carry this node's wall-clock time, not change stamps.
        let now = unix_ms();
        let grace = self.settings.orphan_grace.as_millis() as u64;
        if let Ok(files) = node.dirty_files().await {
            for f in files {
                let action = {
                    let t = self.table();
                    match t.by_file(f.file_id).map(|r| &r.entry) {
                        Some(RecordEntry::File {
                            state: RecordState::Clean,
                            ..
                        }) => Some(PageAction::Clean),
                        Some(_) => None,
                        None if !t.takes_pages(f.file_id)
                            || now.saturating_sub(f.newest_ms) >= grace =>
                        {
                            Some(PageAction::Drop)
                        }
                        None => None,
                    }
                };
                if let Some(a) = action {
                    match node.file_pages(f.file_id, a).await {
                        Ok(n) if a == PageAction::Drop => {
                            self.stats.orphans_dropped.fetch_add(n, Ordering::Relaxed);
                            tracing::info!(pages = n, "dropped dirty pages no record holds");
                        }
                        Ok(_) => {}
                        Err(e) => tracing::warn!(error = %e, "reconciling dirty pages"),
                    }
                }
            }
        }
        let (len, need) = {
            let j = self.journal.lock().unwrap_or_else(|p| p.into_inner());
            (j.len(), self.table().approx_bytes() as u64)
        };
        // Forgotten records leave the journal with the next compaction; until then a restart
        // brings them back, and they are forgotten again by the same rule.
        if len > 2 * need + (1 << 20) {
            let Some(node) = self.this.upgrade() else {
                return;
            };
            let r = tokio::task::spawn_blocking(move || {
                // The table is read under the journal's lock: every record the journal took
                // is in it (see `keep`).
                let mut j = node.journal.lock().unwrap_or_else(|p| p.into_inner());
                let snapshot: Vec<FileRecord> = node.table().iter().cloned().collect();
                j.compact(snapshot.iter())
            })
            .await;
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "compacting the write-back journal"),
                Err(e) => tracing::warn!(error = %e, "compacting the write-back journal"),
            }
        }
    }

    /// Forgets the records that need no more work and are older than
    /// [`WriteBackSettings::keep_records`]: scanned under the read lock, taken out under the
    /// write lock [`FORGET_BATCH`] at a time, so that requests reading the records wait only
    /// for short removals (1M records: the scan about 50 ms; taking out 100,000 at once held
    /// the lock 120 ms, so a batch about 5 ms).
    fn forget_settled(&self) {
        let (now, keep) = (
            self.hlc.now_ms(),
            self.settings.keep_records.as_millis() as u64,
        );
        let old = self.table().settled(now, keep);
        if old.is_empty() {
            return;
        }
        let n: usize = old
            .chunks(FORGET_BATCH)
            .map(|batch| self.table_mut().forget(batch, now, keep))
            .sum();
        self.stats.forgotten.fetch_add(n as u64, Ordering::Relaxed);
        tracing::debug!(records = n, "forgot settled write-back records");
    }

    /// A snapshot for `/metrics`.
    pub fn metrics(&self) -> WriteBackMetrics {
        let s = &self.stats;
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        // The journal's lock is never taken while the table's is held (see `keep`).
        let journal_bytes = self.journal.lock().unwrap_or_else(|p| p.into_inner()).len();
        let t = self.table();
        WriteBackMetrics {
            records: t.len() as u64,
            summary: self.summary_of(&t, "/"),
            flushed_files: g(&s.files),
            flushed_bytes: g(&s.bytes),
            deletes: g(&s.deletes),
            errors: g(&s.errors),
            seals: g(&s.seals),
            orphans_dropped: g(&s.orphans_dropped),
            pages_retired: g(&s.pages_retired),
            forgotten: g(&s.forgotten),
            records_limit: self.settings.max_records as u64,
            journal_bytes,
            clock_lead_ms: self.hlc.lead_ms(),
            caught_up: g(&s.caught_up),
            pulls: g(&s.pulls),
            pulled: g(&s.pulled),
            listings_same: g(&s.listings_same),
            confirm_rounds: g(&s.confirm_rounds),
        }
    }

    fn summary_of(&self, t: &Records, prefix: &str) -> WriteBackSummary {
        let mut s = t.summary(prefix, self.hlc.now_ms());
        s.files_flushing = self.stats.flushing.load(Ordering::Relaxed);
        s.flush_errors = self.stats.errors.load(Ordering::Relaxed);
        s.bytes_flushed = self.stats.bytes.load(Ordering::Relaxed);
        let last = self.last_error.lock().unwrap_or_else(|p| p.into_inner());
        let under = prefix == "/"
            || last.starts_with(&format!("{}/", prefix.trim_end_matches('/')))
            || last.starts_with(&format!("{prefix}:"));
        if under && s.files_dirty + s.deletes_pending > 0 {
            s.last_error = truncate(&last, pagestore_protocol::frame::MAX_MESSAGE_LEN);
        }
        s
    }

    /// The state of a path's file record as a reader sees it.
    pub fn file_state(state: RecordState, transient: bool) -> FileState {
        match (state, transient) {
            (_, true) => FileState::Transient,
            (RecordState::Open, _) => FileState::Writing,
            (RecordState::Final | RecordState::Sealed, _) => FileState::Dirty,
            (RecordState::Clean, _) => FileState::Clean,
        }
    }
}

fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

impl WriteBack for WriteBackNode {
    fn takes_pages(&self, file_id: u128, since: u64) -> bool {
        let keep = self.settings.keep_records.as_millis() as u64;
        let t = self.table();
        t.takes_pages(file_id) && !t.may_be_forgotten(file_id, since, self.hlc.now_ms(), keep)
    }

    fn names(&self, file_id: u128) -> bool {
        self.table().names(file_id)
    }

    fn orphan_grace(&self) -> Duration {
        self.settings.orphan_grace
    }

    fn change(&self, op: ChangeOp) -> SourceFuture<u64> {
        self.on_runtime(move |me| async move { me.plan_and_commit(op).await })
    }

    fn replicate(&self, records: Vec<FileRecord>) -> SourceFuture<u64> {
        self.on_runtime(move |me| async move {
            let top = records.iter().map(|r| r.hlc).max().unwrap_or(0);
            me.keep(records, true).await?;
            Ok(top)
        })
    }

    fn pull(&self, after: &str) -> (Vec<FileRecord>, bool) {
        self.table().after(after, MAX_RECORD_BATCH)
    }

    fn records_of(&self, paths: &[String]) -> Vec<FileRecord> {
        let t = self.table();
        let mut out: Vec<FileRecord> = Vec::with_capacity(paths.len());
        for p in paths {
            out.extend(t.get(p).cloned());
            if let Some(r) = t.first_beneath(p) {
                if !out.iter().any(|o| o.path == r.path) {
                    out.push(r.clone());
                }
            }
        }
        out
    }

    fn records_in(&self, dir: &str, after: &str, digest: u64) -> Option<(Vec<FileRecord>, bool)> {
        let answer = self.table().in_dir(dir, after, MAX_RECORD_BATCH, digest);
        if answer.is_none() {
            self.stats.listings_same.fetch_add(1, Ordering::Relaxed);
        }
        answer
    }

    /// Until enough peers gave their records at start (or the pull at start ended), or
    /// before the node serves.
    fn catching_up(&self) -> bool {
        !self.pulled_at_start.load(Ordering::Acquire)
    }

    fn summary(&self, prefix: &str) -> WriteBackSummary {
        self.summary_of(&self.table(), prefix)
    }

    fn attributes(&self, path: &str, version_tag: &str) -> Option<Vec<Attr>> {
        match self.table().get(path)?.entry {
            RecordEntry::File {
                version_tag: ref v,
                ref attrs,
                ..
            } if v == version_tag => Some(attrs.clone()),
            _ => None,
        }
    }

    fn write_replicas(&self) -> u8 {
        u8::try_from(self.replicas()).unwrap_or(u8::MAX)
    }

    fn write_setting(&self) -> u8 {
        self.settings.write_replicas
    }
}

impl WriteBackNode {
    /// Runs `work` on this node's tokio runtime (whatever thread calls: a shard's executor is
    /// not a tokio runtime) and gives its answer.
    fn on_runtime<F, Fut>(&self, work: F) -> SourceFuture<u64>
    where
        F: FnOnce(Arc<WriteBackNode>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<u64, SourceError>> + Send + 'static,
    {
        let Some(me) = self.this.upgrade() else {
            return Box::pin(async {
                Err(SourceError::new(
                    ErrorCode::Unavailable,
                    "the node is stopping",
                ))
            });
        };
        let task = self.runtime.spawn(work(me));
        Box::pin(async move {
            task.await.map_err(|e| {
                SourceError::new(ErrorCode::Internal, format!("write-back task failed: {e}"))
            })?
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_judged_on_its_paths_and_their_ancestors() {
        let rename = ChangeOp::Rename {
            from: "/ck/run/tmp.pt".into(),
            to: "/ck/model.pt".into(),
            replace: false,
        };
        assert_eq!(
            touched_paths(&rename),
            ["/ck/run/tmp.pt", "/ck/model.pt", "/ck/run", "/ck", "/"]
        );
        assert!(judged(&rename));
        assert!(!judged(&ChangeOp::Rename {
            from: "/a".into(),
            to: "/b".into(),
            replace: true,
        }));
        // A deep path: the paths it names first, then as many ancestors as one request holds.
        let deep = format!("/ck{}", "/d".repeat(100));
        let delete = |expect| ChangeOp::Delete {
            path: deep.clone(),
            dir: false,
            expect,
        };
        let paths = touched_paths(&delete(Expect::Any));
        assert_eq!(paths.len(), MAX_RECORDS_OF);
        assert_eq!(paths[0], deep);
        assert_eq!(paths[1], deep[..deep.len() - 2]);
        assert!(!judged(&delete(Expect::Any)));
        assert!(judged(&delete(Expect::Absent)));
        assert!(judged(&delete(Expect::Version("wb1-2".into()))));
        assert!(judged(&ChangeOp::MakeDir {
            path: "/ck/d".into(),
            mtime_ns: 0,
        }));
        assert!(!judged(&ChangeOp::SetTime {
            path: "/ck/f".into(),
            version_tag: String::new(),
            mtime_ns: 0,
        }));
    }

    #[test]
    fn many_small_files_flush_at_once_and_large_ones_four_at_a_time() {
        let s = WriteBackSettings::default();
        const MIB: u64 = 1 << 20;
        // A large file's flush holds its parts in flight and the one being read.
        assert_eq!(s.flush_cost(10 << 30), 5 * 16 * MIB);
        assert_eq!(s.flush_memory(), 4 * 5 * 16 * MIB);
        let large = s.flush_cost(u64::MAX);
        for running in 0..4u64 {
            assert!(s.may_start(running as usize, running * large, large));
        }
        assert!(!s.may_start(4, 4 * large, large));
        // 4 MiB files (a checkpoint sharded by rank): as many as the parallelism.
        let small = s.flush_cost(4 * MIB);
        assert_eq!(small, 4 * MIB);
        for running in 0..s.flush_parallel {
            assert!(s.may_start(running, running as u64 * small, small));
        }
        assert!(!s.may_start(s.flush_parallel, s.flush_parallel as u64 * small, small));
        // A large file waits while small ones fill the memory, and one flush always starts.
        assert!(!s.may_start(30, 30 * 10 * MIB, large));
        assert!(s.may_start(0, 0, u64::MAX));
    }

    /// A version that reached the store twice has two flushed records of the same rank: a
    /// node keeps the one that names the object the store holds, whichever came first, and
    /// still after a restart.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn of_two_flushes_of_a_version_the_record_naming_the_stores_object_stays() {
        let store = tempfile::tempdir().unwrap();
        let journal = tempfile::tempdir().unwrap();
        std::fs::write(store.path().join("f"), b"x").unwrap();
        let url = format!("file://{}", store.path().display());
        let mounts = ufs::MountTable::new(&[("/ck".to_string(), url)]).unwrap();
        let ufs = Arc::new(UfsSource::new(Arc::new(mounts)));
        let held = ufs.table().stat("/ck/f").await.unwrap().version;
        let open = || {
            let settings = WriteBackSettings::default();
            let rt = tokio::runtime::Handle::current();
            WriteBackNode::open(journal.path(), 1, settings, ufs.clone(), 2, rt).unwrap()
        };
        // Made now: a flushed record as old as the keep is forgotten, never taken back.
        let hlc = unix_ms() << 16;
        let flushed = |store_tag: &str| FileRecord {
            path: "/ck/f".into(),
            hlc,
            origin: FileId::from_u128(2),
            entry: RecordEntry::File {
                version_tag: pagestore_protocol::writeback::new_tag(9),
                size: 1,
                mtime_ns: 0,
                state: RecordState::Clean,
                store_tag: store_tag.into(),
                transient: false,
                attrs: Vec::new(),
            },
        };
        let tag_of = |wb: &WriteBackNode| match &wb.table().get("/ck/f").unwrap().entry {
            RecordEntry::File { store_tag, .. } => store_tag.clone(),
            e => panic!("{e:?}"),
        };
        let wb = open();
        // The first flush's record; its object was overwritten by the second flush.
        let taken = wb.keep(vec![flushed("first")], false).await.unwrap();
        assert_eq!(taken.taken, ["/ck/f"]);
        // A record that names neither the store's object nor a higher rank is not taken.
        let taken = wb.keep(vec![flushed("another")], false).await.unwrap();
        assert!(taken.taken.is_empty());
        assert_eq!(tag_of(&wb), "first");
        // The one naming the store's object replaces it, and the first does not come back.
        let taken = wb.keep(vec![flushed(&held)], false).await.unwrap();
        assert_eq!(taken.taken, ["/ck/f"]);
        assert!(wb
            .keep(vec![flushed("first")], false)
            .await
            .unwrap()
            .taken
            .is_empty());
        assert_eq!(tag_of(&wb), held);
        drop(wb);
        assert_eq!(tag_of(&open()), held, "after a restart");
    }

    /// A flush about to complete an unconditional upload goes on only if the path still names
    /// its version and the store still holds what the flush found.
    #[test]
    fn an_unconditional_flush_completes_only_over_what_it_found() {
        let file = |tag: &str| FileRecord {
            path: "/ck/a".into(),
            hlc: 1,
            origin: FileId::from_u128(1),
            entry: RecordEntry::File {
                version_tag: tag.into(),
                size: 1,
                mtime_ns: 0,
                state: RecordState::Final,
                store_tag: String::new(),
                transient: false,
                attrs: Vec::new(),
            },
        };
        let update = |t: &str| {
            object_store::PutMode::Update(object_store::UpdateVersion {
                e_tag: Some(format!("\"{t}\"")),
                version: None,
            })
        };
        let create = object_store::PutMode::Create;
        let ok = |r: Option<&FileRecord>, mode: &object_store::PutMode, found: Option<&str>| {
            match still_current("/ck/a", "wb1-v1", r, mode, found) {
                Ok(()) => true,
                Err(e) => {
                    assert_eq!(e.code, ErrorCode::Changed, "{e:?}");
                    false
                }
            }
        };
        let v1 = file("wb1-v1");
        assert!(ok(Some(&v1), &create, None));
        assert!(ok(Some(&v1), &update("s1"), Some("s1")));
        // Another flush wrote the object meanwhile, or removed it.
        assert!(!ok(Some(&v1), &create, Some("s2")));
        assert!(!ok(Some(&v1), &update("s1"), Some("s2")));
        assert!(!ok(Some(&v1), &update("s1"), None));
        // A newer version (or a deletion) replaced the one being flushed.
        assert!(!ok(Some(&file("wb1-v2")), &update("s1"), Some("s1")));
        let deleted = FileRecord {
            entry: RecordEntry::Deleted {
                prev_tag: "wb1-v1".into(),
                pending: true,
            },
            ..v1.clone()
        };
        assert!(!ok(Some(&deleted), &create, None));
        assert!(!ok(None, &create, None));
    }
}
