//! The miss path: where a shard gets pages and metadata it does not have.
//!
//! The under storage ([`Source`]) is implemented elsewhere (`pagestore-mounts`: the mount table
//! over `object_store`) and runs on a tokio runtime: its futures are `Send` and are spawned onto the
//! runtime handle the node was given, never polled on a shard's glommio executor. The shard-local
//! [`Loader`] bridges the two with one-shot channels and adds what a cache needs in front of a
//! slow store:
//!
//! - a bound on under-storage requests in flight per shard (a semaphore);
//! - single flight: concurrent misses on one page make one request, and the page's bytes are
//!   handed to every waiter (the load runs as a detached shard task, so a reader that goes away
//!   does not cancel it for the others);
//! - a TTL cache of path metadata (`NotFound` answers included) and of directory listings, so
//!   the member that owns a path answers most `StatPath`/`List` requests without the store.
//! - cache rules: a loaded page is stored under the rule its logical path falls in
//!   ([`pagestore_engine::Rules::classify`]: quota, TTL, pin), decided once per load;
//! - a count of store reads of pages it had read recently already (`ufs_repeat_reads`, over its
//!   last [`RECENT_LOADS`] loads): how the operator sees that a page was fetched more than once;
//! - copies of hot pages from their owner ([`Loader::copy_from_owner`], `crate::spread`): the
//!   same single flight, with the page read from the owning peer, never from the store.

use std::{
    cell::{Cell, RefCell},
    collections::{HashMap, HashSet, VecDeque},
    rc::Rc,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use pagestore_engine::{EngineError, PageKey, Shard};

use pagestore_protocol::{
    frame::{DirEntry, ErrorCode, FileId, FileRef, FileState, MountEntry, PathKind},
    source::{page_version, Source, SourceError, SourceFuture},
};

/// Settings of a shard's [`Loader`].
#[derive(Clone, Debug)]
pub struct LoaderOptions {
    /// Under-storage requests in flight per shard (default 16).
    pub max_inflight: usize,
    /// How long path metadata and listings are trusted (default 10 s). A rewritten object is
    /// seen by new readers at most this long after the change.
    pub metadata_ttl: Duration,
    /// Metadata entries kept per shard before the cache is emptied (default 100,000).
    pub max_metadata: usize,
}

impl Default for LoaderOptions {
    fn default() -> Self {
        LoaderOptions {
            max_inflight: 16,
            metadata_ttl: Duration::from_secs(10),
            max_metadata: 100_000,
        }
    }
}

/// Counters of one shard's loader.
#[derive(Default, Debug)]
pub struct LoaderStats {
    /// Page loads sent to the under storage.
    pub ufs_reads: Cell<u64>,
    /// Bytes read from the under storage.
    pub ufs_bytes: Cell<u64>,
    /// Under-storage requests that failed (metadata included).
    pub ufs_errors: Cell<u64>,
    /// Misses that joined a load already in flight.
    pub coalesced: Cell<u64>,
    /// Loaded pages the cache could not keep (served anyway).
    pub store_failures: Cell<u64>,
    /// Metadata requests answered from the TTL cache.
    pub metadata_hits: Cell<u64>,
    /// Metadata requests sent to the under storage.
    pub metadata_misses: Cell<u64>,
    /// Directories listed to answer their files' stats ([`LIST_AFTER_STATS`]).
    pub dir_listings: Cell<u64>,
    /// Page loads of a page this shard had loaded before, among its last [`RECENT_LOADS`].
    pub ufs_repeat_reads: Cell<u64>,
    /// Hot pages copied from their owner (peer to peer).
    pub owner_copies: Cell<u64>,
    /// Copies the owner could not give (the reader is sent back to the owner).
    pub owner_copy_failures: Cell<u64>,
}

/// Page loads a shard remembers (by key hash) to count repeated store reads of one page.
pub const RECENT_LOADS: usize = 65_536;

/// The key hashes of a shard's last [`RECENT_LOADS`] page loads.
#[derive(Default)]
struct RecentLoads {
    order: VecDeque<u64>,
    set: HashSet<u64>,
}

impl RecentLoads {
    /// Remembers `h`; whether it was remembered already.
    fn seen(&mut self, h: u64) -> bool {
        if !self.set.insert(h) {
            return true;
        }
        if self.order.len() == RECENT_LOADS {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        self.order.push_back(h);
        false
    }
}

/// A loaded page, and whether this call read it from the store (`false`: it joined a load in
/// flight and got the bytes another caller's store read brought).
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The page's bytes.
    pub bytes: Bytes,
    /// This call made the store read.
    pub read_store: bool,
}

type PageResult = Result<Bytes, SourceError>;

/// What a load's leader hands its waiters: the bytes, and whether they came from the store.
type FlightResult = Result<(Bytes, bool), SourceError>;

/// A cached answer and when it was fetched.
type Timed<T> = (Instant, T);

/// Where a directory's listing goes when the store has given it.
type ListingWaiter = futures_channel::oneshot::Sender<Result<Rc<Vec<DirEntry>>, SourceError>>;

enum Flight {
    /// The load is running; these wait for it.
    Loading(Vec<futures_channel::oneshot::Sender<FlightResult>>),
    /// Loaded and being written to the cache: later misses take these bytes; these wait for
    /// the write to end (preloads, which answer only once the page is kept).
    Storing(Bytes, Vec<futures_channel::oneshot::Sender<()>>),
}

/// One shard's bridge to the under storage (see the module docs). Not `Send`: it lives on its
/// shard's thread.
pub struct Loader {
    shard: Rc<Shard>,
    source: Arc<dyn Source>,
    runtime: tokio::runtime::Handle,
    options: LoaderOptions,
    permits: Rc<glommio::sync::Semaphore>,
    flights: RefCell<HashMap<PageKey, Flight>>,
    paths: RefCell<HashMap<String, Timed<Result<PathKind, SourceError>>>>,
    lists: RefCell<HashMap<String, Timed<Rc<Vec<DirEntry>>>>>,
    /// Per directory: store stats of its files since the instant (counted for the TTL), to
    /// list the directory once instead ([`LIST_AFTER_STATS`]).
    dir_stats: RefCell<HashMap<String, Timed<u32>>>,
    /// Directories being listed from the store, each with the requests waiting for its
    /// listing.
    listing: RefCell<HashMap<String, Vec<ListingWaiter>>>,
    /// How many times [`Loader::forget`] ran: a stat or listing that began before a forget
    /// is answered but not cached (it may have read the source before the change it forgets).
    forgets: Cell<u64>,
    recent: RefCell<RecentLoads>,
    stats: LoaderStats,
}

/// A shard that has asked the store for the stats of this many files of one directory within
/// the metadata TTL lists the directory instead (one store request) and answers the stats of
/// its other files from that listing until the TTL ends: a job opening thousands of small
/// files of a directory costs a listing per shard, not a store request per file.
pub const LIST_AFTER_STATS: u32 = 16;

/// Bytes a `Listing` response may spend on names before it stops (the header limit is 64 KiB).
const LISTING_BUDGET: usize = 48 << 10;

impl Loader {
    /// A loader for `shard`, running store requests on `runtime`.
    pub fn new(
        shard: Rc<Shard>,
        source: Arc<dyn Source>,
        runtime: tokio::runtime::Handle,
        options: LoaderOptions,
    ) -> Rc<Loader> {
        Rc::new(Loader {
            shard,
            source,
            runtime,
            permits: Rc::new(glommio::sync::Semaphore::new(
                options.max_inflight.max(1) as u64
            )),
            options,
            flights: RefCell::new(HashMap::new()),
            paths: RefCell::new(HashMap::new()),
            lists: RefCell::new(HashMap::new()),
            dir_stats: RefCell::new(HashMap::new()),
            listing: RefCell::new(HashMap::new()),
            forgets: Cell::new(0),
            recent: RefCell::new(RecentLoads::default()),
            stats: LoaderStats::default(),
        })
    }

    /// The counters.
    pub fn stats(&self) -> &LoaderStats {
        &self.stats
    }

    /// Under-storage requests this shard's loader keeps in flight at most.
    pub fn max_inflight(&self) -> usize {
        self.options.max_inflight.max(1)
    }

    /// The mount table of the source.
    pub fn mounts(&self) -> Vec<MountEntry> {
        self.source.mounts()
    }

    /// Runs `fut` on the tokio side, holding one of this shard's permits.
    async fn on_tokio<T: Send + 'static>(&self, fut: SourceFuture<T>) -> Result<T, SourceError> {
        let _permit = self
            .permits
            .acquire_permit(1)
            .await
            .map_err(|_| SourceError::new(ErrorCode::Unavailable, "shard is shutting down"))?;
        let (tx, rx) = futures_channel::oneshot::channel();
        self.runtime.spawn(async move {
            let _ = tx.send(fut.await);
        });
        let r = rx.await.unwrap_or_else(|_| {
            Err(SourceError::new(
                ErrorCode::Unavailable,
                "the under-storage runtime stopped",
            ))
        });
        if r.is_err() {
            self.stats.ufs_errors.set(self.stats.ufs_errors.get() + 1);
        }
        r
    }

    /// The whole of page `page` of `file` (`page_size` bytes, fewer for the last page), from the
    /// under storage, then kept in the cache. Concurrent calls for one page share one load.
    pub async fn load_page(self: &Rc<Self>, file: &FileRef, page: u64) -> PageResult {
        self.load(file, page).await.map(|l| l.bytes)
    }

    /// Like [`Loader::load_page`], and says whether this call made the store read.
    pub async fn load(self: &Rc<Self>, file: &FileRef, page: u64) -> Result<Loaded, SourceError> {
        self.load_from(file, page, false).await
    }

    /// A hot page this shard serves as one of its replicas: like [`Loader::load`], but read
    /// from the page's owner ([`Source::read_from_owner`]), never from the store: when the
    /// owner cannot give it (down, overloaded, another ring) the answer is `Unavailable` and
    /// the reader asks the owner itself, so a hot page is still read from the store once, by
    /// its owner. Joins a load of the page in flight, as any miss does.
    pub async fn copy_from_owner(
        self: &Rc<Self>,
        file: &FileRef,
        page: u64,
    ) -> Result<Loaded, SourceError> {
        self.load_from(file, page, true).await
    }

    async fn load_from(
        self: &Rc<Self>,
        file: &FileRef,
        page: u64,
        from_owner: bool,
    ) -> Result<Loaded, SourceError> {
        let key = PageKey::new(file.file_id.as_u128(), page);
        let (rx, leader) = {
            let mut flights = self.flights.borrow_mut();
            match flights.get_mut(&key) {
                Some(Flight::Storing(bytes, _)) => {
                    self.stats.coalesced.set(self.stats.coalesced.get() + 1);
                    return Ok(Loaded {
                        bytes: bytes.clone(),
                        read_store: false,
                    });
                }
                Some(Flight::Loading(waiters)) => {
                    self.stats.coalesced.set(self.stats.coalesced.get() + 1);
                    let (tx, rx) = futures_channel::oneshot::channel();
                    waiters.push(tx);
                    (rx, false)
                }
                None => {
                    let (tx, rx) = futures_channel::oneshot::channel();
                    flights.insert(key, Flight::Loading(vec![tx]));
                    (rx, true)
                }
            }
        };
        if leader {
            // Spawned only after the map's borrow ends: glommio may start running the task
            // right away.
            let me = self.clone();
            let file = file.clone();
            glommio::spawn_local(async move { me.run_load(key, file, page, from_owner).await })
                .detach();
        }
        let (bytes, from_store) = rx.await.unwrap_or_else(|_| {
            Err(SourceError::new(
                ErrorCode::Unavailable,
                "the page load was abandoned (shard stopping)",
            ))
        })?;
        Ok(Loaded {
            bytes,
            read_store: leader && from_store,
        })
    }

    /// The page: from its owner (a hot page's copy; `Unavailable` when the owner cannot give
    /// it), or from the store.
    async fn read_page(
        &self,
        key: PageKey,
        file: &FileRef,
        page: u64,
        range: std::ops::Range<u64>,
        from_owner: bool,
    ) -> FlightResult {
        if from_owner {
            let copied = self.on_tokio(self.source.read_from_owner(file, page)).await;
            let err = match copied {
                Ok(b) if b.len() as u64 == range.end - range.start => {
                    self.stats
                        .owner_copies
                        .set(self.stats.owner_copies.get() + 1);
                    return Ok((b, false));
                }
                Ok(b) => SourceError::new(
                    ErrorCode::Changed,
                    format!(
                        "{}: the owner's copy of page {page} has {} bytes, not {}",
                        file.path,
                        b.len(),
                        range.end - range.start
                    ),
                ),
                Err(e) => SourceError::new(
                    ErrorCode::Unavailable,
                    format!(
                        "{}: the owner of hot page {page} could not give it ({}); ask the owner",
                        file.path, e.message
                    ),
                ),
            };
            tracing::debug!(error = %err, "a hot page's copy failed");
            self.stats
                .owner_copy_failures
                .set(self.stats.owner_copy_failures.get() + 1);
            return Err(err);
        }
        self.stats.ufs_reads.set(self.stats.ufs_reads.get() + 1);
        if self.recent.borrow_mut().seen(key.hash64()) {
            self.stats
                .ufs_repeat_reads
                .set(self.stats.ufs_repeat_reads.get() + 1);
        }
        let (start, end) = (range.start, range.end);
        match self.on_tokio(self.source.read(file, range)).await {
            Ok(b) if b.len() as u64 != end - start => Err(SourceError::new(
                ErrorCode::Changed,
                format!(
                    "{}: expected {} bytes at offset {start}, the store returned {}; the \
                     object changed",
                    file.path,
                    end - start,
                    b.len()
                ),
            )),
            r => r.map(|b| (b, true)),
        }
    }

    async fn run_load(self: Rc<Self>, key: PageKey, file: FileRef, page: u64, from_owner: bool) {
        let page_size = u64::from(self.shard.page_size());
        let start = page.saturating_mul(page_size);
        let end = start.saturating_add(page_size).min(file.size);
        let result = if start >= file.size && !(start == 0 && file.size == 0) {
            Err(SourceError::new(
                ErrorCode::BadRange,
                format!(
                    "page {page} starts at byte {start}, past the end of {} ({} bytes)",
                    file.path, file.size
                ),
            ))
        } else {
            self.read_page(key, &file, page, start..end, from_owner)
                .await
        };
        let waiters = {
            let mut flights = self.flights.borrow_mut();
            let waiters = match flights.remove(&key) {
                Some(Flight::Loading(w)) => w,
                _ => Vec::new(),
            };
            if let Ok((bytes, _)) = &result {
                flights.insert(key, Flight::Storing(bytes.clone(), Vec::new()));
            }
            waiters
        };
        for w in waiters {
            let _ = w.send(result.clone());
        }
        if let Ok((bytes, _)) = result {
            self.stats
                .ufs_bytes
                .set(self.stats.ufs_bytes.get() + bytes.len() as u64);
            // The page's rule (quota, TTL, pin) follows its logical path: once per load, never
            // on the hit path.
            let rule = self.shard.rules().classify(&file.path);
            if let Err(e) = self
                .shard
                .put_in_rule(&key, &bytes, page_version(&file.version_tag), rule)
                .await
            {
                self.stats
                    .store_failures
                    .set(self.stats.store_failures.get() + 1);
                match e {
                    EngineError::CacheFull => {
                        tracing::debug!(path = %file.path, page, "cache full: page served, not kept")
                    }
                    EngineError::QuotaFull { rule } => {
                        tracing::debug!(path = %file.path, page, %rule, "rule at its quota: page served, not kept")
                    }
                    e => {
                        tracing::warn!(path = %file.path, page, error = %e, "keeping a loaded page failed")
                    }
                }
            }
            let stored = self.flights.borrow_mut().remove(&key);
            if let Some(Flight::Storing(_, waiters)) = stored {
                for w in waiters {
                    let _ = w.send(());
                }
            }
        }
    }

    /// Like [`Loader::load_page`], but returns only once the loaded page has been written to
    /// the cache (or failed to be): what a preload must wait for before it says it is done.
    pub async fn load_and_keep(
        self: &Rc<Self>,
        file: &FileRef,
        page: u64,
    ) -> Result<Loaded, SourceError> {
        let loaded = self.load(file, page).await?;
        let key = PageKey::new(file.file_id.as_u128(), page);
        let rx = match self.flights.borrow_mut().get_mut(&key) {
            Some(Flight::Storing(_, waiters)) => {
                let (tx, rx) = futures_channel::oneshot::channel();
                waiters.push(tx);
                Some(rx)
            }
            _ => None,
        };
        if let Some(rx) = rx {
            let _ = rx.await;
        }
        Ok(loaded)
    }

    fn trim_metadata(&self) {
        if self.paths.borrow().len() >= self.options.max_metadata {
            self.paths.borrow_mut().clear();
        }
        if self.lists.borrow().len() > self.options.max_metadata / 16 {
            self.lists.borrow_mut().clear();
        }
        if self.dir_stats.borrow().len() > self.options.max_metadata / 16 {
            self.dir_stats.borrow_mut().clear();
        }
    }

    /// What a fresh listing of `path`'s directory cached on this shard says of it: the same
    /// as a stat at the time of the listing. Only a store object's entry with a version
    /// answers (a file written through the cluster has state a listing does not carry, and
    /// a listing without ETags gives no version); anything else, a name the listing lacks
    /// included, is left to a stat.
    fn stat_from_listing(&self, path: &str) -> Option<PathKind> {
        let (dir, name) = split_parent(path)?;
        let lists = self.lists.borrow();
        let (at, all) = lists.get(dir)?;
        if at.elapsed() >= self.options.metadata_ttl {
            return None;
        }
        let i = all.binary_search_by(|e| e.name.as_str().cmp(name)).ok()?;
        let e = &all[i];
        if e.is_dir
            || e.version_tag.is_empty()
            || pagestore_protocol::writeback::is_wb_tag(&e.version_tag)
        {
            return None;
        }
        Some(PathKind::File {
            size: e.size,
            version_tag: e.version_tag.clone(),
            file_id: FileId::from_u128(pagestore_protocol::ring::file_id(path, &e.version_tag)),
            mtime_ns: e.mtime_ns,
            state: FileState::Stored,
            store_tag: e.version_tag.clone(),
        })
    }

    /// Counts a store stat of a file of `path`'s directory; once [`LIST_AFTER_STATS`] were
    /// asked within the TTL, lists the directory (one store request, cached like a `List`)
    /// and answers `path` from it if it holds it.
    async fn stat_through_listing(self: &Rc<Self>, path: &str) -> Option<PathKind> {
        let (dir, _) = split_parent(path)?;
        // A fresh listing that did not answer (a name it lacks, an entry without a version)
        // would not answer if listed again.
        if let Some((at, _)) = self.lists.borrow().get(dir) {
            if at.elapsed() < self.options.metadata_ttl {
                return None;
            }
        }
        let due = {
            let mut counts = self.dir_stats.borrow_mut();
            let c = counts
                .entry(dir.to_string())
                .or_insert_with(|| (Instant::now(), 0));
            if c.0.elapsed() >= self.options.metadata_ttl {
                *c = (Instant::now(), 0);
            }
            c.1 += 1;
            c.1 >= LIST_AFTER_STATS
        };
        // A listing in flight is not waited for: the stat goes to the store.
        if !due || self.listing.borrow().contains_key(dir) {
            return None;
        }
        let listed = self.whole_listing(dir).await;
        // Counted afresh either way: a directory that cannot be listed is tried again only
        // after as many stats again.
        self.dir_stats.borrow_mut().remove(dir);
        listed.ok()?;
        self.stats
            .dir_listings
            .set(self.stats.dir_listings.get() + 1);
        self.stat_from_listing(path)
    }

    /// What `path` names, from the TTL cache or the store. `NotFound` answers are cached too.
    pub async fn stat(self: &Rc<Self>, path: &str) -> Result<PathKind, SourceError> {
        checked(path)?;
        // `/a/b/` names the directory `/a/b`, never a file: asked as `/a/b` (one spelling for
        // the sources and for what is cached).
        match slashed_dir(path) {
            Some(dir) => match self.stat_canonical(dir).await? {
                kind @ PathKind::Dir { .. } => Ok(kind),
                PathKind::File { .. } => Err(SourceError::new(
                    ErrorCode::NotFound,
                    format!(
                        "{path}: not found ({dir} is a file; a path ending in / names a directory)"
                    ),
                )),
            },
            None => self.stat_canonical(path).await,
        }
    }

    /// [`Loader::stat`] of a path without a trailing `/` (but the root).
    async fn stat_canonical(self: &Rc<Self>, path: &str) -> Result<PathKind, SourceError> {
        if let Some(first) = self.source.catch_up(path) {
            // Ends Ok; what it takes makes the node forget what it cached of the paths.
            let _ = self.on_tokio(first).await;
        }
        if let Some((at, r)) = self.paths.borrow().get(path) {
            if at.elapsed() < self.options.metadata_ttl {
                self.stats
                    .metadata_hits
                    .set(self.stats.metadata_hits.get() + 1);
                return r.clone();
            }
        }
        if let Some(kind) = self.stat_from_listing(path) {
            self.stats
                .metadata_hits
                .set(self.stats.metadata_hits.get() + 1);
            return Ok(kind);
        }
        self.stats
            .metadata_misses
            .set(self.stats.metadata_misses.get() + 1);
        if let Some(kind) = self.stat_through_listing(path).await {
            return Ok(kind);
        }
        let forgets = self.forgets.get();
        let r = self.on_tokio(self.source.stat(path)).await;
        let cacheable = self.forgets.get() == forgets
            && match &r {
                Ok(_) => true,
                Err(e) => e.code == ErrorCode::NotFound,
            };
        if cacheable {
            self.trim_metadata();
            self.paths
                .borrow_mut()
                .insert(path.to_string(), (Instant::now(), r.clone()));
        }
        r
    }

    /// Forgets what is cached about `path`: its metadata, its listing, and the metadata and
    /// listing of every directory above it (after a write or a delete: a file written under
    /// new directories makes them exist, and appear in their parents' listings, so a "not
    /// found" cached for one of them must go too). Returns how many entries were dropped.
    pub fn forget(&self, path: &str) -> usize {
        self.forgets.set(self.forgets.get() + 1);
        let mut paths = self.paths.borrow_mut();
        let mut lists = self.lists.borrow_mut();
        let mut n = 0;
        for p in std::iter::once(path).chain(ancestors(path)) {
            n += usize::from(paths.remove(p).is_some());
            n += usize::from(lists.remove(p).is_some());
        }
        n
    }

    /// One page of directory `path`'s listing: entries after `start_after`, and whether more
    /// follow. A listing cached within the TTL answers; otherwise the first page of a large
    /// directory comes from the head of its listing where the source gives one
    /// ([`Source::list_head`]) while the whole listing is made for the pages after it, and
    /// every other page waits for the whole listing (one per directory in flight, however many
    /// ask).
    pub async fn list(
        self: &Rc<Self>,
        path: &str,
        start_after: &str,
    ) -> Result<(Vec<DirEntry>, bool), SourceError> {
        checked(path)?;
        let path = slashed_dir(path).unwrap_or(path);
        if start_after.is_empty() {
            if let Some(first) = self.source.catch_up_listing(path) {
                // As before a stat; the pages after the first come from the listing it made.
                let _ = self.on_tokio(first).await;
            }
        }
        let cached = self
            .lists
            .borrow()
            .get(path)
            .filter(|(at, _)| at.elapsed() < self.options.metadata_ttl)
            .map(|(_, l)| l.clone());
        if let Some(all) = cached {
            self.stats
                .metadata_hits
                .set(self.stats.metadata_hits.get() + 1);
            return Ok(listing_page(&all, start_after));
        }
        self.stats
            .metadata_misses
            .set(self.stats.metadata_misses.get() + 1);
        if start_after.is_empty() && !self.listing.borrow().contains_key(path) {
            let head = self.source.list_head(path, crate::frame::MAX_LIST_ENTRIES);
            if let Some(head) = head {
                let forgets = self.forgets.get();
                let (entries, more) = self.on_tokio(head).await?;
                if !more {
                    // The head is the whole listing.
                    let all = Rc::new(entries);
                    if self.forgets.get() == forgets {
                        self.keep_listing(path, all.clone());
                    }
                    return Ok(listing_page(&all, ""));
                }
                // The pages after this one wait for the whole listing, started now; nobody
                // waits for it yet.
                drop(self.listing_of(path));
                let (page, cut) = listing_page(&entries, "");
                return Ok((page, more || cut));
            }
        }
        let all = self.whole_listing(path).await?;
        Ok(listing_page(&all, start_after))
    }

    /// Caches `all` as `path`'s listing.
    fn keep_listing(&self, path: &str, all: Rc<Vec<DirEntry>>) {
        self.trim_metadata();
        self.lists
            .borrow_mut()
            .insert(path.to_string(), (Instant::now(), all));
    }

    /// `path`'s whole listing from the store, then cached: joins the listing in flight, or
    /// starts one.
    async fn whole_listing(self: &Rc<Self>, path: &str) -> Result<Rc<Vec<DirEntry>>, SourceError> {
        self.listing_of(path).await.unwrap_or_else(|_| {
            Err(SourceError::new(
                ErrorCode::Unavailable,
                "the listing was abandoned (shard stopping)",
            ))
        })
    }

    /// Where `path`'s listing will be sent once the store gave it. The first to ask starts
    /// the listing, on a task of its own: it ends and is cached even if everyone who asked
    /// went away.
    fn listing_of(
        self: &Rc<Self>,
        path: &str,
    ) -> futures_channel::oneshot::Receiver<Result<Rc<Vec<DirEntry>>, SourceError>> {
        let (tx, rx) = futures_channel::oneshot::channel();
        let first = match self.listing.borrow_mut().entry(path.to_string()) {
            std::collections::hash_map::Entry::Occupied(mut o) => {
                o.get_mut().push(tx);
                false
            }
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(vec![tx]);
                true
            }
        };
        if first {
            // Spawned only after the map's borrow ends: glommio may start running the task
            // right away.
            let (me, path) = (self.clone(), path.to_string());
            glommio::spawn_local(async move {
                let forgets = me.forgets.get();
                let listed = me.on_tokio(me.source.list(&path)).await.map(Rc::new);
                match &listed {
                    Ok(all) if me.forgets.get() == forgets => me.keep_listing(&path, all.clone()),
                    _ => {}
                }
                let waiters = me.listing.borrow_mut().remove(&path).unwrap_or_default();
                for tx in waiters {
                    let _ = tx.send(listed.clone());
                }
            })
            .detach();
        }
        rx
    }
}

/// The entries of `all` (sorted by name) after `start_after`, bounded by
/// [`crate::frame::MAX_LIST_ENTRIES`] and the header budget; `true` if more follow.
pub fn listing_page(all: &[DirEntry], start_after: &str) -> (Vec<DirEntry>, bool) {
    let from = all.partition_point(|e| e.name.as_str() <= start_after);
    let mut out = Vec::new();
    let mut bytes = 0;
    for e in &all[from..] {
        // An archived entry is 40 bytes, plus its name and version tag out of line (each
        // padded to 4 bytes).
        let cost = e.name.len() + e.version_tag.len() + 48;
        if out.len() == crate::frame::MAX_LIST_ENTRIES || bytes + cost > LISTING_BUDGET {
            return (out, true);
        }
        bytes += cost;
        out.push(e.clone());
    }
    (out, false)
}

/// A path a client asks about in one spelling only
/// ([`pagestore_protocol::writeback::check_read_path`]): `BadRequest` otherwise.
fn checked(path: &str) -> Result<(), SourceError> {
    pagestore_protocol::writeback::check_read_path(path)
        .map_err(|e| SourceError::new(ErrorCode::BadRequest, e))
}

/// The directory `path` names with a trailing `/` (`/a/b` for `/a/b/`; `None` for `/` and
/// paths without one).
fn slashed_dir(path: &str) -> Option<&str> {
    path.strip_suffix('/').filter(|d| !d.is_empty())
}

/// `path`'s directory and its name within it (`None` for `/` and relative paths).
fn split_parent(path: &str) -> Option<(&str, &str)> {
    let (dir, name) = path.rsplit_once('/')?;
    if name.is_empty() {
        return None;
    }
    Some((if dir.is_empty() { "/" } else { dir }, name))
}

/// The directories above `path`, nearest first, up to `/`.
fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    let mut cur = path.trim_end_matches('/');
    std::iter::from_fn(move || {
        if cur.is_empty() {
            return None;
        }
        let parent = match cur.rsplit_once('/') {
            Some(("", _)) | None => "/",
            Some((p, _)) => p,
        };
        cur = if parent == "/" { "" } else { parent };
        Some(parent)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(n: usize) -> Vec<DirEntry> {
        let mut v: Vec<DirEntry> = (0..n)
            .map(|i| DirEntry {
                name: format!("f{i:06}"),
                is_dir: i % 7 == 0,
                size: i as u64,
                version_tag: format!("{i:032x}"),
                mtime_ns: i as i64,
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    #[test]
    fn ancestors_go_up_to_the_root() {
        fn all(p: &str) -> Vec<&str> {
            ancestors(p).collect()
        }
        assert_eq!(
            all("/data/in/deep/f"),
            ["/data/in/deep", "/data/in", "/data", "/"]
        );
        assert_eq!(all("/data/"), ["/"]);
        assert_eq!(all("/data"), ["/"]);
        assert!(all("/").is_empty());
    }

    #[test]
    fn listing_pages_cover_everything_once_in_order() {
        for n in [0, 1, 999, 1000, 1001, 10_000] {
            let all = entries(n);
            let mut got = Vec::new();
            let mut after = String::new();
            loop {
                let (page, more) = listing_page(&all, &after);
                assert!(page.len() <= crate::frame::MAX_LIST_ENTRIES);
                got.extend(page.iter().cloned());
                if !more {
                    break;
                }
                after = page.last().unwrap().name.clone();
            }
            assert_eq!(got, all, "n = {n}");
        }
    }

    #[test]
    fn long_names_stay_within_the_header_budget() {
        let all: Vec<DirEntry> = (0..500)
            .map(|i| DirEntry {
                name: format!("{i:04}{}", "x".repeat(1020)),
                is_dir: false,
                size: 1,
                version_tag: "v".repeat(crate::frame::MAX_VERSION_TAG_LEN),
                mtime_ns: -1,
            })
            .collect();
        let (page, more) = listing_page(&all, "");
        assert!(more);
        assert!(page.len() > 30 && page.len() < 60, "{}", page.len());
        let resp = crate::frame::Response {
            request_id: 1,
            body: crate::frame::ResponseBody::Listing {
                entries: page,
                more,
            },
        };
        crate::frame::encode_response(&resp, 0, &mut Vec::new()).unwrap();
    }
}
