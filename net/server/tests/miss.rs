//! The shard-side miss path behind the real QUIC endpoint, with an in-process fake under storage
//! (fault injection): read-through with exact bytes and cache hits afterwards, single flight, the
//! per-shard bound on store requests, errors answered as errors (never cached), ring ownership
//! and replicas for `Fetch`, the metadata TTL cache, paged listings and `Cluster`.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::{
    collections::HashMap,
    net::SocketAddr,
    ops::Range,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use pagestore_client::pool::Pool;
use pagestore_engine::{PageKey, ShardHandle};
use pagestore_protocol::{
    frame::{
        self, DirEntry, ErrorCode, FileId, FileRef, FileState, MountEntry, NodeEntry, PathKind,
        Request, RequestBody, ResponseBody, Route,
    },
    ring::{self, MemberId, Ring, RingConfig},
    source::{page_version, Source, SourceError, SourceFuture},
    tls::ClusterCa,
};
use pagestore_server::{
    loader::LoaderOptions,
    node::{LoaderCounters, Node, NodeOptions, NodeSource, ShardState},
    spread::SpreadConfig,
};
use pagestore_testkit::data::bytes as content;

const PAGE: u32 = 64 * 1024;
const P: u64 = PAGE as u64;
const NODE: u128 = 0xA11CE;
/// The modification time the fake store reports for every file (2023-11-14T22:13:20Z): it
/// must reach clients through the metadata cache unchanged.
const MTIME_NS: i64 = 1_700_000_000_000_000_000;
const OTHER: u128 = 0xB0B;

// ---------------------------------------------------------------------------
// The fake under storage
// ---------------------------------------------------------------------------

/// What the fake holds and what it saw. Shared by the test and the [`FakeSource`] the node gets.
#[derive(Default)]
struct FakeState {
    /// path -> (version tag, content).
    files: Mutex<HashMap<String, (String, Vec<u8>)>>,
    /// Directory listings (sorted by name), by directory path.
    dirs: Mutex<HashMap<String, Vec<DirEntry>>>,
    mounts: Vec<MountEntry>,
    reads: AtomicU64,
    stats: AtomicU64,
    lists: AtomicU64,
    /// Every read: (path, range asked for).
    read_log: Mutex<Vec<(String, Range<u64>)>>,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    /// Delay of each read, in milliseconds (0: none).
    delay_ms: AtomicU64,
    /// Reads fail with `Io` while set.
    fail_reads: AtomicBool,
    /// Pages copied "from the owner" (`Source::read_from_owner`): the peer copies of hot pages.
    owner_reads: AtomicU64,
    /// Copies from the owner fail while set.
    fail_owner: AtomicBool,
    /// Whether the fake gives the heads of listings (`Source::list_head`), and how many it gave.
    gives_heads: AtomicBool,
    heads: AtomicU64,
    /// Delay of each stat's answer, in milliseconds (0: none).
    stat_delay_ms: AtomicU64,
    /// Delay of each whole listing, in milliseconds, and the whole listings that ended.
    list_delay_ms: AtomicU64,
    lists_done: AtomicU64,
}

impl FakeState {
    fn put_file(&self, path: &str, version: &str, data: Vec<u8>) {
        self.files
            .lock()
            .unwrap()
            .insert(path.to_string(), (version.to_string(), data));
    }

    fn set_dir(&self, path: &str, entries: Vec<DirEntry>) {
        self.dirs.lock().unwrap().insert(path.to_string(), entries);
    }

    fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }

    fn stats(&self) -> u64 {
        self.stats.load(Ordering::SeqCst)
    }

    fn lists(&self) -> u64 {
        self.lists.load(Ordering::SeqCst)
    }

    /// Reads of `path` that started at byte `start`.
    fn reads_at(&self, path: &str, start: u64) -> usize {
        self.read_log
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, r)| p == path && r.start == start)
            .count()
    }

    fn answer_read(&self, file: &FileRef, range: Range<u64>) -> Result<Bytes, SourceError> {
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(SourceError::new(ErrorCode::Io, "injected read failure"));
        }
        let files = self.files.lock().unwrap();
        let Some((version, data)) = files.get(&file.path) else {
            return Err(SourceError::new(
                ErrorCode::NotFound,
                format!("{} not found", file.path),
            ));
        };
        if *version != file.version_tag {
            return Err(SourceError::new(
                ErrorCode::Changed,
                format!(
                    "{} is at version {version}, not {}",
                    file.path, file.version_tag
                ),
            ));
        }
        let len = data.len() as u64;
        let start = range.start.min(len) as usize;
        let end = range.end.min(len).max(range.start.min(len)) as usize;
        Ok(Bytes::copy_from_slice(&data[start..end]))
    }

    fn answer_stat(&self, path: &str) -> Result<PathKind, SourceError> {
        if let Some((version, data)) = self.files.lock().unwrap().get(path) {
            return Ok(PathKind::File {
                size: data.len() as u64,
                version_tag: version.clone(),
                file_id: FileId::from_u128(ring::file_id(path, version)),
                mtime_ns: MTIME_NS,
                state: FileState::Stored,
                store_tag: version.clone(),
            });
        }
        let prefix = format!("{}/", path.trim_end_matches('/'));
        let is_dir = self.dirs.lock().unwrap().contains_key(path)
            || self
                .files
                .lock()
                .unwrap()
                .keys()
                .any(|p| p.starts_with(&prefix));
        if is_dir {
            Ok(PathKind::DIR)
        } else {
            Err(SourceError::new(
                ErrorCode::NotFound,
                format!("{path} not found"),
            ))
        }
    }
}

/// The [`Source`] the node is given.
struct FakeSource(Arc<FakeState>);

impl Source for FakeSource {
    fn read(&self, file: &FileRef, range: Range<u64>) -> SourceFuture<Bytes> {
        let s = self.0.clone();
        let file = file.clone();
        Box::pin(async move {
            s.reads.fetch_add(1, Ordering::SeqCst);
            s.read_log
                .lock()
                .unwrap()
                .push((file.path.clone(), range.clone()));
            let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            s.max_in_flight.fetch_max(now, Ordering::SeqCst);
            let delay = s.delay_ms.load(Ordering::SeqCst);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            let r = s.answer_read(&file, range);
            s.in_flight.fetch_sub(1, Ordering::SeqCst);
            r
        })
    }

    fn stat(&self, path: &str) -> SourceFuture<PathKind> {
        let s = self.0.clone();
        let path = path.to_string();
        Box::pin(async move {
            // The store answers as it is now; the answer takes the delay to arrive.
            let answer = s.answer_stat(&path);
            s.stats.fetch_add(1, Ordering::SeqCst);
            let delay = s.stat_delay_ms.load(Ordering::SeqCst);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            answer
        })
    }

    fn list(&self, path: &str) -> SourceFuture<Vec<DirEntry>> {
        let s = self.0.clone();
        let path = path.to_string();
        Box::pin(async move {
            s.lists.fetch_add(1, Ordering::SeqCst);
            let delay = s.list_delay_ms.load(Ordering::SeqCst);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            let r =
                s.dirs.lock().unwrap().get(&path).cloned().ok_or_else(|| {
                    SourceError::new(ErrorCode::NotFound, format!("{path} not found"))
                });
            s.lists_done.fetch_add(1, Ordering::SeqCst);
            r
        })
    }

    fn list_head(&self, path: &str, max: usize) -> Option<SourceFuture<(Vec<DirEntry>, bool)>> {
        if !self.0.gives_heads.load(Ordering::SeqCst) {
            return None;
        }
        let s = self.0.clone();
        let path = path.to_string();
        Some(Box::pin(async move {
            s.heads.fetch_add(1, Ordering::SeqCst);
            let dirs = s.dirs.lock().unwrap();
            let all = dirs.get(&path).ok_or_else(|| {
                SourceError::new(ErrorCode::NotFound, format!("{path} not found"))
            })?;
            Ok((all[..all.len().min(max)].to_vec(), all.len() > max))
        }))
    }

    fn mounts(&self) -> Vec<MountEntry> {
        self.0.mounts.clone()
    }

    /// The owner's copy of a whole page: the fake's bytes, counted apart from store reads.
    fn read_from_owner(&self, file: &FileRef, page: u64) -> SourceFuture<Bytes> {
        let s = self.0.clone();
        let file = file.clone();
        Box::pin(async move {
            s.owner_reads.fetch_add(1, Ordering::SeqCst);
            if s.fail_owner.load(Ordering::SeqCst) {
                return Err(SourceError::new(
                    ErrorCode::Unavailable,
                    "owner unreachable",
                ));
            }
            s.answer_read(&file, page * P..(page + 1) * P)
        })
    }
}

// ---------------------------------------------------------------------------
// A node over the fake
// ---------------------------------------------------------------------------

struct Setup {
    shards: usize,
    loader: LoaderOptions,
    ring: Ring,
    replicas: u8,
    nodes: Vec<NodeEntry>,
    mounts: Vec<MountEntry>,
    /// Memory tier bytes over all shards.
    memory_cache: u64,
    /// Hot-page replicas.
    spread: SpreadConfig,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            shards: 2,
            loader: LoaderOptions::default(),
            ring: common::no_ring(),
            replicas: 0,
            nodes: Vec::new(),
            mounts: Vec::new(),
            memory_cache: 0,
            spread: SpreadConfig::default(),
        }
    }
}

/// Fields drop in order: the node stops before the runtime its loads run on.
struct Harness {
    node: Node,
    rt: tokio::runtime::Runtime,
    fake: Arc<FakeState>,
    ca: ClusterCa,
    _dir: tempfile::TempDir,
}

impl Harness {
    fn start(setup: Setup) -> Harness {
        let dir = common::tempdir();
        let ca = ClusterCa::generate("miss test cluster").unwrap();
        let server = common::server_config(&ca, false);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let fake = Arc::new(FakeState {
            mounts: setup.mounts,
            ..Default::default()
        });
        let node = Node::start(
            common::engine_config(dir.path(), PAGE, 256, setup.shards),
            NodeOptions {
                source: Some(NodeSource {
                    source: Arc::new(FakeSource(fake.clone())),
                    runtime: rt.handle().clone(),
                    options: setup.loader,
                }),
                nodes: setup.nodes,
                replicas: setup.replicas,
                writeback: None,
                memory_cache: setup.memory_cache,
                spread: setup.spread,
                ..common::node_options(server, NODE, setup.ring)
            },
        )
        .unwrap();
        Harness {
            node,
            rt,
            fake,
            ca,
            _dir: dir,
        }
    }

    fn addr(&self, shard: usize) -> SocketAddr {
        self.node.addrs()[shard]
    }

    fn shard(&self, shard: usize) -> &ShardHandle<ShardState> {
        &self.node.engine().unwrap().shards()[shard]
    }

    /// A client pool; call inside `self.rt`.
    fn pool(&self) -> Arc<Pool> {
        common::pool(&self.ca, None, "127.0.0.1:0")
    }

    /// The loader counters summed over shards.
    async fn counters(&self) -> LoaderCounters {
        let all = self.node.loader_counters().await.unwrap();
        all.iter()
            .fold(LoaderCounters::default(), |a, c| LoaderCounters {
                ufs_reads: a.ufs_reads + c.ufs_reads,
                ufs_bytes: a.ufs_bytes + c.ufs_bytes,
                ufs_errors: a.ufs_errors + c.ufs_errors,
                coalesced: a.coalesced + c.coalesced,
                metadata_hits: a.metadata_hits + c.metadata_hits,
                metadata_misses: a.metadata_misses + c.metadata_misses,
                store_failures: a.store_failures + c.store_failures,
                ufs_repeat_reads: a.ufs_repeat_reads + c.ufs_repeat_reads,
                owner_copies: a.owner_copies + c.owner_copies,
                owner_copy_failures: a.owner_copy_failures + c.owner_copy_failures,
                dir_listings: a.dir_listings + c.dir_listings,
            })
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Sends `body` to `addr` and returns the answer and its payload.
async fn ask(pool: &Pool, addr: SocketAddr, body: RequestBody) -> (ResponseBody, Vec<u8>) {
    let req = Request {
        request_id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        body,
    };
    let (resp, bytes) = pool.request(addr, &req, bytes::Bytes::new()).await.unwrap();
    (resp.body, bytes.to_vec())
}

fn file_ref(path: &str, version: &str, size: u64) -> FileRef {
    FileRef {
        file_id: FileId::from_u128(ring::file_id(path, version)),
        mount: String::new(),
        path: path.to_string(),
        version_tag: version.to_string(),
        size,
    }
}

fn fetch(file: &FileRef, page: u64, offset: u32, len: u32) -> RequestBody {
    fetch_as(file, page, offset, len, Route::Owner)
}

fn fetch_as(file: &FileRef, page: u64, offset: u32, len: u32, route: Route) -> RequestBody {
    RequestBody::Fetch {
        file: file.clone(),
        page,
        offset,
        len,
        epoch: 0,
        route,
    }
}

#[track_caller]
fn assert_error(body: &ResponseBody, want: ErrorCode) {
    match body {
        ResponseBody::Error { code, .. } if *code == want => {}
        other => panic!("expected an Error {want:?}, got {other:?}"),
    }
}

fn key(file: &FileRef, page: u64) -> PageKey {
    PageKey::new(file.file_id.as_u128(), page)
}

/// Waits until a loaded page has been written to the cache (that happens after the reply).
async fn wait_cached(shard: &ShardHandle<ShardState>, key: PageKey) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !shard.contains(key).await.unwrap() {
        assert!(
            Instant::now() < deadline,
            "loaded page {key:?} never reached the cache"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[test]
fn read_through_returns_exact_bytes_then_hits_the_cache() {
    let h = Harness::start(Setup::default());
    let path = "/d/a.bin";
    let data = content(1, (2 * P + P / 2) as usize);
    h.fake.put_file(path, "v1", data.clone());
    let f = file_ref(path, "v1", data.len() as u64);
    let version = page_version("v1");
    let addr = h.addr(0);
    h.rt.block_on(async {
        let pool = h.pool();
        // (page, offset, len, bytes of the file expected, page_len)
        let cold = [
            (0, 0, PAGE, 0..P, PAGE),
            (1, 1000, 5000, P + 1000..P + 6000, PAGE),
            (2, 0, frame::MAX_PAGE_LEN, 2 * P..2 * P + P / 2, PAGE / 2),
        ];
        for (i, (page, offset, len, want, page_len)) in cold.into_iter().enumerate() {
            let (body, bytes) = ask(&pool, addr, fetch(&f, page, offset, len)).await;
            assert_eq!(
                body,
                ResponseBody::Data {
                    page_len,
                    version,
                    spread: 0
                },
                "page {page}"
            );
            assert!(
                bytes == data[want.start as usize..want.end as usize],
                "page {page} {offset}+{len}: wrong bytes ({} returned)",
                bytes.len()
            );
            assert_eq!(h.fake.reads(), i as u64 + 1, "one store read per cold page");
        }
        // The store was asked for whole pages, the last one clipped to the file.
        let log = h.fake.read_log.lock().unwrap().clone();
        assert_eq!(
            log,
            vec![
                (path.to_string(), 0..P),
                (path.to_string(), P..2 * P),
                (path.to_string(), 2 * P..2 * P + P / 2),
            ]
        );
        for page in 0..3 {
            wait_cached(h.shard(0), key(&f, page)).await;
        }
        let before = h.shard(0).stats().await.unwrap();
        // Hits: a range inside page 0, and one of the last page that crosses its end.
        let (body, bytes) = ask(&pool, addr, fetch(&f, 0, 777, 10_000)).await;
        assert_eq!(
            body,
            ResponseBody::Data {
                page_len: PAGE,
                version,
                spread: 0,
            }
        );
        assert!(bytes == data[777..10_777]);
        let (body, bytes) = ask(&pool, addr, fetch(&f, 2, PAGE / 2 - 100, 1000)).await;
        assert_eq!(
            body,
            ResponseBody::Data {
                page_len: PAGE / 2,
                version,
                spread: 0,
            }
        );
        assert!(bytes == data[(2 * P + P / 2 - 100) as usize..]);
        let after = h.shard(0).stats().await.unwrap();
        assert_eq!(after.hits, before.hits + 2, "the second fetches were hits");
        assert_eq!(h.fake.reads(), 3, "hits must not reach the store");
        let per_shard = h.node.loader_counters().await.unwrap();
        assert_eq!(per_shard[0].ufs_reads, 3);
        assert_eq!(per_shard[0].ufs_bytes, data.len() as u64);
        assert_eq!(
            per_shard[1],
            LoaderCounters::default(),
            "shard 1 was not asked"
        );
        pool.close();
    });
}

#[test]
fn an_empty_file_has_one_empty_page() {
    let h = Harness::start(Setup::default());
    h.fake.put_file("/z/empty", "e1", Vec::new());
    let f = file_ref("/z/empty", "e1", 0);
    let addr = h.addr(1);
    h.rt.block_on(async {
        let pool = h.pool();
        for _ in 0..2 {
            let (body, bytes) = ask(&pool, addr, fetch(&f, 0, 0, PAGE)).await;
            assert_eq!(
                body,
                ResponseBody::Data {
                    page_len: 0,
                    version: page_version("e1"),
                    spread: 0,
                }
            );
            assert!(bytes.is_empty());
        }
        let (body, _) = ask(&pool, addr, fetch(&f, 1, 0, PAGE)).await;
        assert_error(&body, ErrorCode::BadRange);
        pool.close();
    });
}

#[test]
fn concurrent_misses_on_one_page_make_one_store_read() {
    let h = Harness::start(Setup::default());
    let path = "/sf/x";
    let data = content(2, 3 * P as usize);
    h.fake.put_file(path, "v7", data.clone());
    h.fake.delay_ms.store(200, Ordering::SeqCst);
    let f = file_ref(path, "v7", data.len() as u64);
    let addr = h.addr(0);
    h.rt.block_on(async {
        let pool = h.pool();
        // Connect first, so that the 16 fetches arrive together.
        let (pong, _) = ask(&pool, addr, RequestBody::Ping { nonce: 1 }).await;
        assert_eq!(pong, ResponseBody::Pong { nonce: 1 });
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let pool = pool.clone();
                let f = f.clone();
                tokio::spawn(
                    async move { ask(&pool, addr, fetch(&f, 1, 0, frame::MAX_PAGE_LEN)).await },
                )
            })
            .collect();
        for t in tasks {
            let (body, bytes) = t.await.unwrap();
            assert_eq!(
                body,
                ResponseBody::Data {
                    page_len: PAGE,
                    version: page_version("v7"),
                    spread: 0,
                }
            );
            assert!(bytes == data[P as usize..2 * P as usize]);
        }
        assert_eq!(
            h.fake.reads_at(path, P),
            1,
            "the page was read more than once"
        );
        assert_eq!(h.fake.reads(), 1);
        let c = h.counters().await;
        assert_eq!(c.ufs_reads, 1);
        assert!(c.coalesced >= 15, "only {} misses coalesced", c.coalesced);
        pool.close();
    });
}

#[test]
fn the_memory_tier_serves_hot_pages_without_the_disk_and_forgets_removed_files() {
    // One shard with room for two pages in memory.
    let h = Harness::start(Setup {
        shards: 1,
        memory_cache: 2 * P,
        mounts: vec![MountEntry {
            prefix: "/m".into(),
            url: "file:///srv/m?egress_usd_per_tb=20".into(),
        }],
        ..Setup::default()
    });
    let path = "/m/w.bin";
    let data = content(9, 4 * P as usize);
    h.fake.put_file(path, "v1", data.clone());
    let f = file_ref(path, "v1", data.len() as u64);
    let version = page_version("v1");
    let addr = h.addr(0);
    let page = |p: u64| data[(p * P) as usize..((p + 1) * P) as usize].to_vec();
    h.rt.block_on(async {
        let pool = h.pool();
        let memory = || async { h.node.metrics().await.unwrap()[0].clone() };
        let get = |p: u64, offset: u32, len: u32| {
            let pool = pool.clone();
            let f = f.clone();
            async move { ask(&pool, addr, fetch(&f, p, offset, len)).await }
        };
        // Cold: loaded from the store, kept on disk and (no copy) in memory.
        let (body, bytes) = get(0, 0, PAGE).await;
        assert_eq!(
            body,
            ResponseBody::Data {
                page_len: PAGE,
                version,
                spread: 0,
            }
        );
        assert!(bytes == page(0));
        wait_cached(h.shard(0), key(&f, 0)).await;
        let m = memory().await;
        assert_eq!(
            (m.memory.admissions, m.memory.bytes, m.memory.capacity),
            (1, P, 2 * P)
        );
        // Warm: from memory, exact bytes of any range, no disk read, no store read.
        let disk_hits = m.engine.hits;
        for (offset, len) in [(0, PAGE), (100, 5000), (PAGE - 10, 1000)] {
            let (body, bytes) = get(0, offset, len).await;
            assert_eq!(
                body,
                ResponseBody::Data {
                    page_len: PAGE,
                    version,
                    spread: 0,
                }
            );
            let end = (offset + len).min(PAGE) as usize;
            assert!(bytes == page(0)[offset as usize..end], "{offset}+{len}");
        }
        let m = memory().await;
        assert_eq!(m.memory.hits, 3);
        assert_eq!(m.memory_hit_bytes, P + 5000 + 10);
        assert_eq!(m.engine.hits, disk_hits, "memory hits never read the disk");
        assert_eq!(h.fake.reads(), 1);
        // Past the page's end from memory: the same BadRange as from disk.
        let (body, _) = get(0, PAGE + 1, 10).await;
        assert_error(&body, ErrorCode::BadRange);

        // Pages 1..4, loaded once each, pass through the small FIFO; page 0, read three times,
        // moves to the main FIFO and stays (S3-FIFO: a one-pass scan does not flush it).
        for p in 1..4 {
            let (_, bytes) = get(p, 0, PAGE).await;
            assert!(bytes == page(p));
            wait_cached(h.shard(0), key(&f, p)).await;
        }
        let m = memory().await;
        assert_eq!(
            (m.memory.bytes, m.memory.evictions),
            (2 * P, 2),
            "{:?}",
            m.memory
        );
        assert_eq!(h.fake.reads(), 4);
        let (_, bytes) = get(0, 0, PAGE).await;
        assert!(bytes == page(0));
        assert_eq!(
            memory().await.memory.hits,
            m.memory.hits + 1,
            "page 0 stayed"
        );
        // Page 1 left memory for the ghost; read from disk now, it is copied back in (the whole
        // page, though 20 bytes were asked for), then served from memory.
        let before = memory().await;
        let (_, bytes) = get(1, 10, 20).await;
        assert!(bytes == page(1)[10..30]);
        let after = memory().await;
        assert_eq!(after.engine.hits, before.engine.hits + 2, "two disk reads");
        assert_eq!(after.memory.admissions, before.memory.admissions + 1);
        let (_, bytes) = get(1, 0, PAGE).await;
        assert!(bytes == page(1));
        assert_eq!(memory().await.memory.hits, after.memory.hits + 1);
        assert_eq!(h.fake.reads(), 4, "no store read for any of this");

        // Removing the file drops its memory entries too: the next read goes to the store.
        let held = memory().await.memory.pages;
        assert!(held >= 1);
        let remove = RequestBody::RemoveFile {
            file_id: f.file_id,
            epoch: 0,
        };
        let body = ask_as(&h, pagestore_protocol::tls::Role::Admin, addr, remove).await;
        assert!(matches!(body, ResponseBody::Removed { .. }), "{body:?}");
        assert_eq!(memory().await.memory.bytes, 0);
        for p in 0..4 {
            let (_, bytes) = get(p, 0, PAGE).await;
            assert!(bytes == page(p));
        }
        assert_eq!(h.fake.reads(), 8, "every page came from the store again");

        // Egress: bytes served without a store read of their own vs. read from the store.
        let m = memory().await;
        assert_eq!(m.mounts.len(), 1);
        let mb = &m.mounts[0];
        assert_eq!((mb.prefix.as_str(), mb.usd_per_tb), ("/m", 20.0));
        assert_eq!(mb.store_bytes, 8 * P);
        // Everything but the 20 bytes copied in from disk came from memory.
        assert_eq!(mb.cache_bytes, m.memory_hit_bytes + 20);
        assert_eq!(mb.cache_bytes + mb.store_bytes, m.served_bytes);

        // The same through the wire: the hottest file and page, and the mount's bytes.
        let (body, payload) = ask(&pool, addr, RequestBody::Hot).await;
        assert_eq!(body, ResponseBody::Hot);
        let r = frame::decode_hot_report(&payload).unwrap();
        assert_eq!(r.files.len(), 1);
        let hot = &r.files[0];
        assert_eq!(
            (hot.path.as_str(), hot.file_id, hot.reads),
            (path, f.file_id, 14)
        );
        assert_eq!((hot.bytes, hot.bytes_error), (m.served_bytes, 0));
        assert_eq!((r.pages[0].key.page, r.pages[0].reads), (0, 6));
        assert_eq!(r.mounts, m.mounts);
        pool.close();
    });
}

#[test]
fn store_reads_in_flight_per_shard_are_bounded() {
    let h = Harness::start(Setup {
        shards: 1,
        loader: LoaderOptions {
            max_inflight: 2,
            ..Default::default()
        },
        ..Default::default()
    });
    let path = "/b/ten";
    let data = content(3, 10 * P as usize);
    h.fake.put_file(path, "v1", data.clone());
    h.fake.delay_ms.store(100, Ordering::SeqCst);
    let f = file_ref(path, "v1", data.len() as u64);
    let addr = h.addr(0);
    h.rt.block_on(async {
        let pool = h.pool();
        ask(&pool, addr, RequestBody::Ping { nonce: 2 }).await;
        let start = Instant::now();
        let tasks: Vec<_> = (0..10u64)
            .map(|page| {
                let pool = pool.clone();
                let f = f.clone();
                tokio::spawn(
                    async move { (page, ask(&pool, addr, fetch(&f, page, 0, PAGE)).await) },
                )
            })
            .collect();
        for t in tasks {
            let (page, (body, bytes)) = t.await.unwrap();
            assert!(
                matches!(body, ResponseBody::Data { page_len: PAGE, .. }),
                "{body:?}"
            );
            assert!(
                bytes == data[(page * P) as usize..((page + 1) * P) as usize],
                "page {page}"
            );
        }
        let elapsed = start.elapsed();
        let max = h.fake.max_in_flight.load(Ordering::SeqCst);
        assert!(
            max <= 2,
            "{max} store reads in flight on one shard, limit 2"
        );
        assert_eq!(
            max, 2,
            "the reads never overlapped: the test proves nothing"
        );
        assert_eq!(h.fake.reads(), 10);
        // 10 reads of 100 ms, two at a time.
        assert!(
            elapsed >= Duration::from_millis(450),
            "10 delayed reads finished in {elapsed:?}"
        );
        pool.close();
    });
}

#[test]
fn store_and_request_errors_are_answers_and_failures_are_not_cached() {
    let h = Harness::start(Setup::default());
    let path = "/e/f";
    let data = content(4, (2 * P + P / 2) as usize);
    h.fake.put_file(path, "v2", data.clone());
    h.fake
        .put_file("/e/short", "s1", content(5, (P + 10) as usize));
    let f = file_ref(path, "v2", data.len() as u64);
    let addr = h.addr(0);
    h.rt.block_on(async {
        let pool = h.pool();
        // The object has another version now.
        let stale = file_ref(path, "v1", data.len() as u64);
        let (body, _) = ask(&pool, addr, fetch(&stale, 0, 0, PAGE)).await;
        assert_error(&body, ErrorCode::Changed);
        // No such object.
        let (body, _) = ask(
            &pool,
            addr,
            fetch(&file_ref("/e/none", "v1", P), 0, 0, PAGE),
        )
        .await;
        assert_error(&body, ErrorCode::NotFound);
        // The object is shorter than the FileRef says: the last page comes back short.
        let (body, _) = ask(
            &pool,
            addr,
            fetch(&file_ref("/e/short", "s1", 2 * P), 1, 0, PAGE),
        )
        .await;
        assert_error(&body, ErrorCode::Changed);
        let reads = h.fake.reads();
        assert_eq!(reads, 3);

        // A file id that is not the path's at that version: refused before any store request.
        let mut forged = f.clone();
        forged.file_id = FileId::from_u128(ring::file_id(path, "v1"));
        let (body, _) = ask(&pool, addr, fetch(&forged, 0, 0, PAGE)).await;
        assert_error(&body, ErrorCode::BadRequest);
        forged.file_id = FileId::from_u128(0xDEAD_BEEF);
        let (body, _) = ask(&pool, addr, fetch(&forged, 0, 0, PAGE)).await;
        assert_error(&body, ErrorCode::BadRequest);
        // A page past the end of the file: refused without a store request.
        let (body, _) = ask(&pool, addr, fetch(&f, 3, 0, PAGE)).await;
        assert_error(&body, ErrorCode::BadRange);
        let (body, _) = ask(&pool, addr, fetch(&f, u64::MAX, 0, PAGE)).await;
        assert_error(&body, ErrorCode::BadRange);
        assert_eq!(h.fake.reads(), reads, "a refused request reached the store");
        // An offset past the end of the (last, short) page: cold, then cached.
        for _ in 0..2 {
            let (body, _) = ask(&pool, addr, fetch(&f, 2, PAGE / 2 + 1, 10)).await;
            assert_error(&body, ErrorCode::BadRange);
            wait_cached(h.shard(0), key(&f, 2)).await;
        }
        assert_eq!(h.fake.reads(), reads + 1);

        // The store fails: each fetch is an Io error and asks the store again.
        let at0 = h.fake.reads_at(path, 0); // the stale-version read above
        h.fake.fail_reads.store(true, Ordering::SeqCst);
        for _ in 0..2 {
            let (body, _) = ask(&pool, addr, fetch(&f, 0, 0, PAGE)).await;
            assert_error(&body, ErrorCode::Io);
        }
        assert_eq!(h.fake.reads_at(path, 0), at0 + 2, "a failure was cached");
        assert!(!h.shard(0).contains(key(&f, 0)).await.unwrap());
        // Repaired: the same page loads.
        h.fake.fail_reads.store(false, Ordering::SeqCst);
        let (body, bytes) = ask(&pool, addr, fetch(&f, 0, 0, PAGE)).await;
        assert_eq!(
            body,
            ResponseBody::Data {
                page_len: PAGE,
                version: page_version("v2"),
                spread: 0,
            }
        );
        assert!(bytes == data[..P as usize]);
        assert_eq!(h.fake.reads_at(path, 0), at0 + 3);
        let c = h.counters().await;
        // The short read is a successful store request turned into `Changed`: not a store error.
        assert_eq!(c.ufs_errors, 4, "Changed, NotFound and two Io failures");
        pool.close();
    });
}

/// This node's two shards and one shard of another node, epoch 7.
fn two_node_ring() -> Ring {
    let me = |shard| MemberId { node: NODE, shard };
    let other = MemberId {
        node: OTHER,
        shard: 0,
    };
    Ring::new([me(0), me(1), other], RingConfig::default(), 7).unwrap()
}

/// One shard's counters, asked over QUIC.
async fn shard_counters(pool: &Pool, addr: SocketAddr) -> frame::ShardCounters {
    let (body, bytes) = ask(pool, addr, RequestBody::Counters).await;
    assert_eq!(body, ResponseBody::Counters);
    frame::decode_counters(&bytes).unwrap()
}

#[test]
fn hot_pages_are_spread_by_their_owner_and_copied_from_it_by_their_replicas() {
    // A hot page spreads over 2 members on distinct nodes, so every key owned by the other
    // node has its second member here.
    let ring = two_node_ring();
    let h = Harness::start(Setup {
        ring: ring.clone(),
        spread: SpreadConfig {
            spread: 3,
            threshold: 20.0,
            half_life: Duration::from_secs(1),
            cool: Duration::from_secs(1),
            max_pages: 16,
        },
        ..Default::default()
    });
    let path = "/o/hot";
    let pages = 32u64;
    let data = content(9, (pages * P) as usize);
    h.fake.put_file(path, "v1", data.clone());
    let f = file_ref(path, "v1", data.len() as u64);
    let fid = f.file_id.as_u128();
    let local = |m: MemberId| (m.node == NODE).then_some(m.shard as usize);
    // A page this node owns, and two owned by the other node (each with its replica here).
    let mine = (0..pages)
        .find(|&p| ring.owner(fid, p).unwrap().node == NODE)
        .unwrap();
    let theirs: Vec<(u64, usize)> = (0..pages)
        .filter(|&p| ring.owner(fid, p).unwrap().node == OTHER)
        .map(|p| (p, local(ring.replicas(fid, p, 2)[1]).unwrap()))
        .take(2)
        .collect();
    assert_eq!(theirs.len(), 2, "the ring gives the other node pages");
    let bytes_of = |p: u64| data[(p * P) as usize..((p + 1) * P) as usize].to_vec();
    h.rt.block_on(async {
        let pool = h.pool();
        // The owner: cold pages are not hot; 60 reads within a second make one hot, and its
        // answers say so, clamped to the ring's 2 nodes.
        let owner = h.addr(local(ring.owner(fid, mine).unwrap()).unwrap());
        let mut spreads = Vec::new();
        for _ in 0..60 {
            let (body, bytes) = ask(&pool, owner, fetch(&f, mine, 0, PAGE)).await;
            let ResponseBody::Data { spread, .. } = body else {
                panic!("{body:?}");
            };
            assert!(bytes == bytes_of(mine));
            spreads.push(spread);
        }
        assert_eq!(spreads[0], 0, "one read is not hot");
        assert_eq!(*spreads.last().unwrap(), 2, "{spreads:?}");
        assert!(spreads.iter().all(|&s| s == 0 || s == 2));
        let c = shard_counters(&pool, owner).await;
        assert_eq!((c.hot_now, c.hot_turned), (1, 1));
        assert_eq!(
            h.fake.reads(),
            1,
            "the hot page was read from the store once"
        );

        // A replica asked for a hot page it does not hold copies it from the owner (not the
        // store), keeps it, and serves the next read itself.
        let (page, shard) = theirs[0];
        let replica = h.addr(shard);
        let store_reads = h.fake.reads();
        for offset in [0, 1000] {
            let (body, bytes) =
                ask(&pool, replica, fetch_as(&f, page, offset, 5000, Route::Hot)).await;
            assert!(
                matches!(
                    body,
                    ResponseBody::Data {
                        page_len: PAGE,
                        spread: 0,
                        ..
                    }
                ),
                "{body:?}"
            );
            assert!(bytes == bytes_of(page)[offset as usize..offset as usize + 5000]);
        }
        wait_cached(h.shard(shard), key(&f, page)).await;
        assert_eq!(h.fake.owner_reads.load(Ordering::SeqCst), 1);
        assert_eq!(h.fake.reads(), store_reads, "no store read for a copy");
        let c = shard_counters(&pool, replica).await;
        assert_eq!(
            (
                c.replica_copies,
                c.replicas_held,
                c.replica_hot_reads,
                c.replica_copy_failures
            ),
            (1, 1, 2, 0)
        );
        // The same request routed as the owner's, or as a fallback (no --replicas here), is
        // refused: a shard serves keys it does not own only as a member the route names.
        for route in [Route::Owner, Route::Fallback] {
            let (body, _) = ask(&pool, replica, fetch_as(&f, page, 0, 10, route)).await;
            assert_eq!(body, ResponseBody::NotOwner { epoch: 7 }, "{route:?}");
        }
        // A shard outside the page's first members is refused a hot read too.
        let outside = (0..2).find(|&s| s != shard).unwrap();
        let (body, _) = ask(
            &pool,
            h.addr(outside),
            fetch_as(&f, page, 0, 10, Route::Hot),
        )
        .await;
        assert_eq!(body, ResponseBody::NotOwner { epoch: 7 });

        // The owner cannot give the page: the replica does not read the store (the page would
        // be read from it twice); it answers Unavailable, so the reader asks the owner itself.
        h.fake.fail_owner.store(true, Ordering::SeqCst);
        let (page2, shard2) = theirs[1];
        let (body, _) = ask(
            &pool,
            h.addr(shard2),
            fetch_as(&f, page2, 0, PAGE, Route::Hot),
        )
        .await;
        assert_error(&body, ErrorCode::Unavailable);
        assert_eq!(
            h.fake.reads(),
            store_reads,
            "no store read for a failed copy"
        );
        assert!(!h.shard(shard2).contains(key(&f, page2)).await.unwrap());
        let c = shard_counters(&pool, h.addr(shard2)).await;
        assert_eq!((c.replica_copy_failures, c.replicas_held), (1, 0));
        h.fake.fail_owner.store(false, Ordering::SeqCst);

        // The owner is back: the copy is made.
        let (_, bytes) = ask(
            &pool,
            h.addr(shard2),
            fetch_as(&f, page2, 0, PAGE, Route::Hot),
        )
        .await;
        assert!(bytes == bytes_of(page2));
        // Nobody reads the copies: after the cooling time (1 s, swept every 250 ms) they are
        // dropped from the replicas' caches, and a later hot read copies the page again.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let held = shard_counters(&pool, replica).await.replicas_held
                + shard_counters(&pool, h.addr(shard2)).await.replicas_held;
            if held == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "copies were never dropped");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(!h.shard(shard).contains(key(&f, page)).await.unwrap());
        assert!(!h.shard(shard2).contains(key(&f, page2)).await.unwrap());
        let c = shard_counters(&pool, replica).await;
        assert_eq!(c.replicas_dropped, 1);
        let (_, bytes) = ask(&pool, replica, fetch_as(&f, page, 0, PAGE, Route::Hot)).await;
        assert!(bytes == bytes_of(page));
        assert_eq!(h.fake.owner_reads.load(Ordering::SeqCst), 4);

        // Files written through the cluster are never spread (their write members hold them).
        let wb = file_ref("/o/written", "wb1-0123456789abcdef0123456789abcdef", P);
        let wfid = wb.file_id.as_u128();
        if let Some((p, s)) = (0..64u64)
            .filter(|&p| ring.owner(wfid, p).unwrap().node == OTHER)
            .map(|p| (p, local(ring.replicas(wfid, p, 2)[1]).unwrap()))
            .next()
        {
            let (body, _) = ask(&pool, h.addr(s), fetch_as(&wb, p, 0, 10, Route::Hot)).await;
            assert_eq!(body, ResponseBody::NotOwner { epoch: 7 });
        }
    });
}

#[test]
fn fetches_for_keys_this_shard_neither_owns_nor_replicates_are_not_owner() {
    let ring = two_node_ring();
    let h = Harness::start(Setup {
        ring: ring.clone(),
        replicas: 1,
        ..Default::default()
    });
    let path = "/o/f";
    let pages = 48u64;
    let data = content(6, (pages * P) as usize);
    h.fake.put_file(path, "v1", data.clone());
    let f = file_ref(path, "v1", data.len() as u64);
    let fid = f.file_id.as_u128();
    h.rt.block_on(async {
        let pool = h.pool();
        // [owner serves, replica serves, other node's key refused, sibling shard's key refused]
        let mut seen = [0u32; 4];
        for page in 0..pages {
            let owner = ring.owner(fid, page).unwrap();
            let set = ring.replicas(fid, page, 2);
            for shard in 0..2u16 {
                let me = MemberId { node: NODE, shard };
                for replica in [false, true] {
                    let (body, bytes) = ask(
                        &pool,
                        h.addr(shard as usize),
                        fetch_as(
                            &f,
                            page,
                            5,
                            100,
                            if replica {
                                Route::Fallback
                            } else {
                                Route::Owner
                            },
                        ),
                    )
                    .await;
                    let serves = owner == me || (replica && set.contains(&me));
                    if serves {
                        assert!(
                            matches!(body, ResponseBody::Data { page_len: PAGE, .. }),
                            "page {page} shard {shard} replica {replica}: {body:?}"
                        );
                        let at = (page * P + 5) as usize;
                        assert!(bytes == data[at..at + 100]);
                        seen[usize::from(owner != me)] += 1;
                    } else {
                        assert_eq!(
                            body,
                            ResponseBody::NotOwner { epoch: 7 },
                            "page {page} shard {shard} replica {replica}"
                        );
                        if owner.node == OTHER && !replica {
                            seen[2] += 1;
                        }
                        if owner.node == NODE && replica {
                            seen[3] += 1;
                        }
                    }
                }
            }
        }
        assert!(seen.iter().all(|&n| n > 0), "cases not covered: {seen:?}");
        // The shards counted the replica reads they served and the requests they refused.
        let m = h.node.metrics().await.unwrap();
        let replica_reads: u64 = m.iter().map(|s| s.replica_reads).sum();
        let not_owner: u64 = m.iter().map(|s| s.not_owner).sum();
        assert_eq!(replica_reads, u64::from(seen[1]));
        assert_eq!(not_owner, u64::from(pages as u32 * 4 - seen[0] - seen[1]));

        // The other node leaves (epoch 8): its keys move to this node's shards.
        let mine = ring.members().iter().copied().filter(|m| m.node == NODE);
        let ring8 = Ring::new(mine, RingConfig::default(), 8).unwrap();
        h.node
            .set_ring(Arc::new(ring8.clone()), Arc::new(Vec::new()))
            .await
            .unwrap();
        let page = (0..pages)
            .find(|&p| ring.owner(fid, p).unwrap().node == OTHER)
            .unwrap();
        let owner = ring8.owner(fid, page).unwrap();
        for shard in 0..2u16 {
            let (body, _) = ask(&pool, h.addr(shard as usize), fetch(&f, page, 0, 10)).await;
            if owner.shard == shard {
                assert!(matches!(body, ResponseBody::Data { .. }), "{body:?}");
            } else {
                assert_eq!(body, ResponseBody::NotOwner { epoch: 8 });
            }
        }
        pool.close();
    });
}

#[test]
fn path_metadata_is_cached_for_the_ttl_and_listings_page_through_every_entry() {
    let ttl = Duration::from_millis(400);
    let h = Harness::start(Setup {
        loader: LoaderOptions {
            metadata_ttl: ttl,
            ..Default::default()
        },
        ..Default::default()
    });
    h.fake.put_file("/m/a", "v1", vec![1; 1000]);
    let entries: Vec<DirEntry> = (0..2500u64)
        .map(|i| DirEntry {
            name: format!("f{i:05}"),
            is_dir: i % 10 == 0,
            size: if i % 10 == 0 { 0 } else { i },
            version_tag: if i % 10 == 0 {
                String::new()
            } else {
                format!("{i:032x}")
            },
            mtime_ns: if i % 10 == 0 { 0 } else { MTIME_NS + i as i64 },
        })
        .collect();
    h.fake.set_dir("/big", entries.clone());
    let addr = h.addr(0);
    let stat = |p: &str| RequestBody::StatPath {
        path: p.to_string(),
    };
    let info = |size: u64, v: &str| ResponseBody::PathInfo {
        kind: PathKind::File {
            size,
            version_tag: v.to_string(),
            file_id: FileId::from_u128(ring::file_id("/m/a", v)),
            mtime_ns: MTIME_NS,
            state: FileState::Stored,
            store_tag: v.to_string(),
        },
    };
    h.rt.block_on(async {
        let pool = h.pool();
        ask(&pool, addr, RequestBody::Ping { nonce: 3 }).await;
        let t0 = Instant::now();
        assert_eq!(ask(&pool, addr, stat("/m/a")).await.0, info(1000, "v1"));
        assert_eq!(ask(&pool, addr, stat("/m/a")).await.0, info(1000, "v1"));
        // Rewritten: within the TTL the shard still answers the cached version.
        h.fake.put_file("/m/a", "v2", vec![2; 2000]);
        assert_eq!(ask(&pool, addr, stat("/m/a")).await.0, info(1000, "v1"));
        assert_eq!(
            h.fake.stats(),
            1,
            "three stats within the TTL ({:?} elapsed) reached the store more than once",
            t0.elapsed()
        );
        // Not found, twice: cached as well.
        for _ in 0..2 {
            assert_error(
                &ask(&pool, addr, stat("/m/none")).await.0,
                ErrorCode::NotFound,
            );
        }
        assert_eq!(h.fake.stats(), 2, "a NotFound answer was not cached");
        tokio::time::sleep(ttl + Duration::from_millis(100)).await;
        assert_eq!(ask(&pool, addr, stat("/m/a")).await.0, info(2000, "v2"));
        assert_eq!(h.fake.stats(), 3);
        assert_eq!(ask(&pool, addr, stat("/m/a")).await.0, info(2000, "v2"));
        assert_eq!(h.fake.stats(), 3);
        assert_error(
            &ask(&pool, addr, stat("/m/none")).await.0,
            ErrorCode::NotFound,
        );
        assert_eq!(
            h.fake.stats(),
            4,
            "an expired NotFound was still answered from the cache"
        );
        assert_eq!(
            ask(&pool, addr, stat("/m")).await.0,
            ResponseBody::PathInfo {
                kind: PathKind::DIR
            }
        );
        let c = h.counters().await;
        assert_eq!((c.metadata_misses, c.metadata_hits), (5, 4));

        // 2,500 entries, a page at a time.
        let mut got = Vec::new();
        let mut mores = Vec::new();
        let mut start_after = String::new();
        loop {
            let (body, _) = ask(
                &pool,
                addr,
                RequestBody::List {
                    path: "/big".into(),
                    start_after: start_after.clone(),
                },
            )
            .await;
            let ResponseBody::Listing {
                entries: page,
                more,
            } = body
            else {
                panic!("{body:?}");
            };
            assert!(
                !page.is_empty() || !more,
                "an empty page that says more follow"
            );
            mores.push(more);
            if let Some(last) = page.last() {
                start_after = last.name.clone();
            }
            got.extend(page);
            if !more {
                break;
            }
            assert!(mores.len() < 10, "the listing does not end");
        }
        assert!(
            got == entries,
            "{} entries listed, not every entry once in order",
            got.len()
        );
        assert!(mores.len() >= 3, "{} pages", mores.len());
        assert!(
            mores[..mores.len() - 1].iter().all(|&m| m),
            "more was false before the last page: {mores:?}"
        );
        assert_eq!(
            h.fake.lists(),
            1,
            "the listing was not cached between pages"
        );
        let (body, _) = ask(
            &pool,
            addr,
            RequestBody::List {
                path: "/nope".into(),
                start_after: String::new(),
            },
        )
        .await;
        assert_error(&body, ErrorCode::NotFound);
        pool.close();
    });
}

/// `Invalidate` of version `version` of `path` at `addr`, sent with a writer's certificate.
async fn invalidate(h: &Harness, addr: SocketAddr, path: &str, version: &str) {
    let invalidate = RequestBody::Invalidate {
        path: path.into(),
        file_id: FileId::from_u128(ring::file_id(path, version)),
    };
    let body = ask_as(h, pagestore_protocol::tls::Role::Writer, addr, invalidate).await;
    assert!(matches!(body, ResponseBody::Removed { .. }), "{body:?}");
}

/// `body` asked of `addr` over a connection of its own, with a certificate of `role`: the
/// answer's body.
async fn ask_as(
    h: &Harness,
    role: pagestore_protocol::tls::Role,
    addr: SocketAddr,
    body: RequestBody,
) -> ResponseBody {
    let id = h.ca.issue("as-role", role).unwrap();
    let pool = common::pool(&h.ca, Some(&id), "127.0.0.1:0");
    let (answer, _) = ask(&pool, addr, body).await;
    pool.close();
    answer
}

/// A stat that read the store before the path was invalidated (a write through the cluster
/// makes every shard forget the path the same way) is answered, but not cached: the next stat
/// asks the store again and sees the new version, not the old one for the metadata TTL. It
/// was cached once it ended, after the invalidation had dropped what was cached before.
#[test]
fn a_stat_in_flight_when_its_path_is_forgotten_is_not_cached() {
    let h = Harness::start(Setup {
        loader: LoaderOptions {
            metadata_ttl: Duration::from_secs(600),
            ..Default::default()
        },
        ..Default::default()
    });
    let path = "/m/raced";
    h.fake.put_file(path, "v1", vec![1; 10]);
    let addr = h.addr(0);
    let stat = || RequestBody::StatPath { path: path.into() };
    let version = |body: ResponseBody| match body {
        ResponseBody::PathInfo {
            kind: PathKind::File { version_tag, .. },
        } => version_tag,
        other => panic!("{other:?}"),
    };
    h.rt.block_on(async {
        let pool = h.pool();
        h.fake.stat_delay_ms.store(500, Ordering::SeqCst);
        let first = {
            let pool = pool.clone();
            tokio::spawn(async move { ask(&pool, addr, stat()).await.0 })
        };
        // The stat is in the store's hands; the object changes and the path is invalidated.
        let deadline = Instant::now() + Duration::from_secs(10);
        while h.fake.stats() == 0 {
            assert!(
                Instant::now() < deadline,
                "the stat never reached the store"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        h.fake.put_file(path, "v2", vec![2; 20]);
        invalidate(&h, addr, path, "v1").await;
        assert_eq!(version(first.await.unwrap()), "v1");
        h.fake.stat_delay_ms.store(0, Ordering::SeqCst);
        assert_eq!(version(ask(&pool, addr, stat()).await.0), "v2");
        assert_eq!(h.fake.stats(), 2);
        // Cached from then on.
        assert_eq!(version(ask(&pool, addr, stat()).await.0), "v2");
        assert_eq!(h.fake.stats(), 2);
        pool.close();
    });
}

/// Asks for one page of `path`'s listing.
async fn list_page(pool: &Pool, addr: SocketAddr, path: &str, after: &str) -> ResponseBody {
    let body = RequestBody::List {
        path: path.into(),
        start_after: after.into(),
    };
    ask(pool, addr, body).await.0
}

fn listing(body: ResponseBody) -> (Vec<DirEntry>, bool) {
    match body {
        ResponseBody::Listing { entries, more } => (entries, more),
        other => panic!("not a listing: {other:?}"),
    }
}

#[test]
fn a_large_directory_answers_its_first_page_from_its_head_and_the_rest_from_one_listing() {
    let h = Harness::start(Setup::default());
    h.fake.gives_heads.store(true, Ordering::SeqCst);
    h.fake.list_delay_ms.store(1500, Ordering::SeqCst);
    let entries: Vec<DirEntry> = (0..2500u64)
        .map(|i| DirEntry {
            name: format!("f{i:05}"),
            is_dir: false,
            size: i,
            version_tag: format!("{i:032x}"),
            mtime_ns: MTIME_NS,
        })
        .collect();
    h.fake.set_dir("/big", entries.clone());
    let small = entries[..10].to_vec();
    h.fake.set_dir("/small", small.clone());
    h.fake.set_dir("/going", entries.clone());
    let addr = h.addr(0);
    h.rt.block_on(async {
        let pool = h.pool();
        // The first page does not wait for the whole listing (1.5 s in the store).
        let (first, more) = listing(list_page(&pool, addr, "/big", "").await);
        assert!(more && !first.is_empty());
        assert_eq!(first, entries[..first.len()]);
        assert_eq!(h.fake.heads.load(Ordering::SeqCst), 1);
        assert_eq!(
            h.fake.lists_done.load(Ordering::SeqCst),
            0,
            "the first page waited for the whole listing"
        );
        // The pages after it wait for the one whole listing the first page started, however
        // many ask at once.
        let after = first.last().unwrap().name.clone();
        let (a, b, c) = tokio::join!(
            list_page(&pool, addr, "/big", &after),
            list_page(&pool, addr, "/big", &after),
            list_page(&pool, addr, "/big", &after)
        );
        assert!(a == b && b == c, "one page, three answers");
        let mut got = first;
        let mut next = listing(a);
        loop {
            let more = next.1;
            got.extend(next.0);
            if !more {
                break;
            }
            let last = got.last().unwrap().name.clone();
            next = listing(list_page(&pool, addr, "/big", &last).await);
        }
        assert!(
            got == entries,
            "{} entries, not each once in order",
            got.len()
        );
        assert_eq!(h.fake.lists(), 1, "the directory was listed more than once");

        // A head that holds the whole directory is its listing: nothing more is asked.
        for _ in 0..2 {
            assert_eq!(
                listing(list_page(&pool, addr, "/small", "").await),
                (small.clone(), false)
            );
        }
        assert_eq!(h.fake.heads.load(Ordering::SeqCst), 2);
        assert_eq!(h.fake.lists(), 1);

        // The whole listing fails (the directory went away after its head): the pages that
        // wait for it get the error.
        let (first, more) = listing(list_page(&pool, addr, "/going", "").await);
        assert!(more);
        h.fake.dirs.lock().unwrap().remove("/going");
        let last = first.last().unwrap().name.clone();
        assert_error(
            &list_page(&pool, addr, "/going", &last).await,
            ErrorCode::NotFound,
        );
        // And a directory the store does not have fails at its head.
        assert_error(
            &list_page(&pool, addr, "/nope", "").await,
            ErrorCode::NotFound,
        );
        pool.close();
    });
}

#[test]
fn cluster_reports_page_size_nodes_replicas_and_mounts() {
    let members = [(NODE, 2u16), (OTHER, 4)]
        .into_iter()
        .flat_map(|(node, n)| (0..n).map(move |shard| MemberId { node, shard }));
    let ring = Ring::new(members, RingConfig::default(), 3).unwrap();
    let nodes = vec![
        NodeEntry {
            id: FileId::from_u128(NODE),
            addr: "127.0.0.1:7000".into(),
            shards: 2,
        },
        NodeEntry {
            id: FileId::from_u128(OTHER),
            addr: "10.0.0.2:7000".into(),
            shards: 4,
        },
    ];
    let mounts = vec![
        MountEntry {
            prefix: String::new(),
            url: "mem://root".into(),
        },
        MountEntry {
            prefix: "/s3".into(),
            url: "s3://bucket/data".into(),
        },
    ];
    let h = Harness::start(Setup {
        ring,
        replicas: 2,
        nodes: nodes.clone(),
        mounts: mounts.clone(),
        ..Default::default()
    });
    h.rt.block_on(async {
        let pool = h.pool();
        for shard in 0..2 {
            let (body, _) = ask(&pool, h.addr(shard), RequestBody::Cluster).await;
            assert_eq!(
                body,
                ResponseBody::ClusterInfo {
                    page_size: PAGE,
                    epoch: 3,
                    replicas: 2,
                    nodes: nodes.clone(),
                    mounts: mounts.clone(),
                    write_replicas: 1,
                }
            );
        }
        pool.close();
    });
}

#[test]
fn a_preload_answers_only_once_its_pages_are_kept() {
    let h = Harness::start(Setup::default());
    let path = "/d/preload.bin";
    let data = content(77, (8 * P) as usize);
    h.fake.put_file(path, "v1", data.clone());
    let f = file_ref(path, "v1", data.len() as u64);
    h.rt.block_on(async {
        let pool = h.pool();
        let (body, _) = ask(
            &pool,
            h.addr(0),
            RequestBody::LoadPages {
                file: f.clone(),
                pages: (0..8).collect(),
                epoch: 0,
            },
        )
        .await;
        assert_eq!(
            body,
            ResponseBody::Loaded {
                pages: 8,
                bytes: 8 * P
            }
        );
        // No waiting: when `Loaded` arrives every page is in the cache, so a job that is done
        // is all hits.
        for page in 0..8 {
            assert!(
                h.shard(0).contains(key(&f, page)).await.unwrap(),
                "page {page} was not kept when the preload answered"
            );
        }
        // A second preload finds them all and loads nothing.
        let (body, _) = ask(
            &pool,
            h.addr(0),
            RequestBody::LoadPages {
                file: f.clone(),
                pages: (0..8).collect(),
                epoch: 0,
            },
        )
        .await;
        assert_eq!(body, ResponseBody::Loaded { pages: 0, bytes: 0 });
        assert_eq!(h.fake.reads(), 8);
        pool.close();
    });
}

// ---------------------------------------------------------------------------
// Many files per preload request (`LoadFiles`)
// ---------------------------------------------------------------------------

fn load_files(files: &[(FileRef, Vec<u64>)]) -> RequestBody {
    RequestBody::LoadFiles {
        files: files
            .iter()
            .map(|(file, pages)| frame::LoadFile {
                file: file.clone(),
                pages: pages.clone(),
            })
            .collect(),
        epoch: 0,
    }
}

#[test]
fn many_files_load_in_one_request_each_once_with_an_outcome_per_file() {
    let h = Harness::start(Setup {
        shards: 1,
        ..Default::default()
    });
    // 60 small files (shorter than a page, one of them empty), two of 3 pages, and three
    // that fail each in its own way.
    let mut good: Vec<(FileRef, Vec<u64>, Vec<u8>)> = Vec::new();
    for i in 0..60u64 {
        let path = format!("/small/f{i:03}");
        let data = content(1000 + i, if i == 7 { 0 } else { 100 + i as usize * 500 });
        h.fake.put_file(&path, "v1", data.clone());
        let pages = if data.is_empty() { vec![] } else { vec![0] };
        good.push((file_ref(&path, "v1", data.len() as u64), pages, data));
    }
    for i in 0..2u64 {
        let path = format!("/big/b{i}");
        let data = content(2000 + i, (2 * P + 77) as usize);
        h.fake.put_file(&path, "v1", data.clone());
        good.push((
            file_ref(&path, "v1", data.len() as u64),
            vec![0, 1, 2],
            data,
        ));
    }
    h.fake.put_file("/small/changed", "v2", content(5, 100));
    let missing = file_ref("/small/missing", "v1", 100);
    let changed = file_ref("/small/changed", "v1", 100);
    let forged = FileRef {
        file_id: FileId::from_u128(12345),
        ..file_ref("/small/f000", "v1", good[0].2.len() as u64)
    };
    let mut asked: Vec<(FileRef, Vec<u64>)> = good
        .iter()
        .map(|(f, p, _)| (f.clone(), p.clone()))
        .collect();
    // The failing ones in the middle: the files after them still load.
    asked.insert(10, (missing.clone(), vec![0]));
    asked.insert(20, (changed.clone(), vec![0]));
    asked.insert(30, (forged, vec![0]));
    h.fake.delay_ms.store(2, Ordering::SeqCst);
    h.rt.block_on(async {
        let pool = h.pool();
        let (body, _) = ask(&pool, h.addr(0), load_files(&asked)).await;
        let ResponseBody::FilesLoaded { outcomes } = body else {
            panic!("expected FilesLoaded, got {body:?}");
        };
        assert_eq!(outcomes.len(), asked.len());
        for ((f, pages), o) in asked.iter().zip(&outcomes) {
            match f.path.as_str() {
                "/small/missing" => assert!(
                    matches!(o, frame::FileOutcome::Failed { code: ErrorCode::NotFound, loaded: 0, message } if !message.is_empty()),
                    "{o:?}"
                ),
                "/small/changed" => assert!(
                    matches!(o, frame::FileOutcome::Failed { code: ErrorCode::Changed, loaded: 0, .. }),
                    "{o:?}"
                ),
                _ if f.file_id.as_u128() == 12345 => assert!(
                    matches!(o, frame::FileOutcome::Failed { code: ErrorCode::BadRequest, loaded: 0, .. }),
                    "{o:?}"
                ),
                _ => assert_eq!(
                    *o,
                    frame::FileOutcome::Loaded {
                        pages: pages.len() as u32,
                        bytes: f.size
                    },
                    "{}",
                    f.path
                ),
            }
        }
        // Each page was read from the store once, kept before the answer, and is what the
        // store holds; the forged file id made no read and cached nothing under it.
        for (f, pages, data) in &good {
            for &p in pages {
                assert_eq!(h.fake.reads_at(&f.path, p * P), 1, "{} page {p}", f.path);
                assert!(h.shard(0).contains(key(f, p)).await.unwrap(), "{}", f.path);
                let (body, bytes) = ask(&pool, h.addr(0), fetch(f, p, 0, PAGE)).await;
                assert!(matches!(body, ResponseBody::Data { .. }), "{body:?}");
                let end = ((p + 1) * P).min(data.len() as u64) as usize;
                assert!(bytes[..] == data[(p * P) as usize..end], "{} page {p}", f.path);
            }
        }
        let pages: u64 = good.iter().map(|(_, p, _)| p.len() as u64).sum();
        assert_eq!(h.fake.reads(), pages + 2, "one read per page, and the two failures");
        // The loads went through the loader: never more store reads at once than its bound.
        let bound = LoaderOptions::default().max_inflight as u64;
        assert!(h.fake.max_in_flight.load(Ordering::SeqCst) <= bound);

        // Again: every page is cached, nothing is read.
        let reads = h.fake.reads();
        let again: Vec<(FileRef, Vec<u64>)> = good
            .iter()
            .map(|(f, p, _)| (f.clone(), p.clone()))
            .collect();
        let (body, _) = ask(&pool, h.addr(0), load_files(&again)).await;
        assert_eq!(
            body,
            ResponseBody::FilesLoaded {
                outcomes: vec![frame::FileOutcome::Loaded { pages: 0, bytes: 0 }; again.len()]
            }
        );
        assert_eq!(h.fake.reads(), reads);
        pool.close();
    });
}

#[test]
fn a_load_of_many_files_naming_a_page_of_another_member_loads_nothing() {
    let members = [
        MemberId {
            node: NODE,
            shard: 0,
        },
        MemberId {
            node: OTHER,
            shard: 0,
        },
    ];
    let ring = Ring::new(members, RingConfig::default(), 7).unwrap();
    let h = Harness::start(Setup {
        shards: 1,
        ring: ring.clone(),
        ..Default::default()
    });
    let mut mine = Vec::new();
    let mut theirs = None;
    for i in 0..64u64 {
        let path = format!("/o/f{i}");
        h.fake.put_file(&path, "v1", content(i, 10));
        let f = file_ref(&path, "v1", 10);
        if ring.owner(f.file_id.as_u128(), 0).unwrap().node == NODE {
            mine.push((f, vec![0]));
        } else {
            theirs.get_or_insert(f);
        }
    }
    let theirs = theirs.expect("some file is the other node's");
    let mut asked = mine.clone();
    asked.push((theirs, vec![0]));
    h.rt.block_on(async {
        let pool = h.pool();
        let (body, _) = ask(&pool, h.addr(0), load_files(&asked)).await;
        assert!(
            matches!(body, ResponseBody::NotOwner { epoch: 7 }),
            "{body:?}"
        );
        assert_eq!(h.fake.reads(), 0, "nothing loaded");
        let (body, _) = ask(&pool, h.addr(0), load_files(&mine)).await;
        assert!(matches!(body, ResponseBody::FilesLoaded { .. }), "{body:?}");
        assert_eq!(h.fake.reads(), mine.len() as u64);
        pool.close();
    });
}

/// A `LoadFiles` frame whose first file's path is one byte longer than `MAX_PATH_LEN`: valid
/// as an archive (the extra byte is the alignment padding before the page indices), refused
/// by the protocol's limits.
fn over_long_path_frame() -> Vec<u8> {
    let file = FileRef {
        file_id: FileId::from_u128(ring::file_id("/x", "v1")),
        mount: "mmmmmmmmm".into(),
        path: "p".repeat(frame::MAX_PATH_LEN),
        version_tag: "v1".into(),
        size: 10,
    };
    let req = Request {
        request_id: 1,
        body: load_files(&[(file, vec![0])]),
    };
    let mut out = Vec::new();
    frame::encode_request(&req, 0, &mut out).unwrap();
    // The path's length word: (L & 0x3f) | 0x80 | (L & !0x3f) << 2 for L = 4096.
    let len = |l: u32| (l & 0x3f) | 0x80 | ((l & !0x3f) << 2);
    let word = len(frame::MAX_PATH_LEN as u32).to_le_bytes();
    let at = out
        .windows(4)
        .position(|w| w == word)
        .expect("the path's length word");
    out[at..at + 4].copy_from_slice(&len(frame::MAX_PATH_LEN as u32 + 1).to_le_bytes());
    out
}

#[test]
fn a_load_of_many_files_beyond_the_limits_is_refused_and_loads_nothing() {
    let h = Harness::start(Setup::default());
    h.fake.put_file("/x", "v1", content(1, 10));
    let raw = over_long_path_frame();
    let err = frame::decode_request_frame(&raw).unwrap_err();
    assert!(matches!(err, frame::FrameError::Limit(_)), "{err}");
    h.rt.block_on(async {
        let pool = h.pool();
        let reply = pool
            .call(h.addr(0), &raw, bytes::Bytes::new())
            .await
            .unwrap();
        let (resp, _) = frame::decode_response_frame(&reply).unwrap();
        assert_error(&resp.body, ErrorCode::TooLarge);
        // Too many files or pages cannot even be encoded by a client.
        let many = vec![(file_ref("/x", "v1", 10), vec![0]); frame::MAX_LOAD_FILES + 1];
        let req = Request {
            request_id: 2,
            body: load_files(&many),
        };
        assert!(matches!(
            frame::encode_request(&req, 0, &mut Vec::new()),
            Err(frame::FrameError::Limit(_))
        ));
        // At the limit it is served, and the one page is read once.
        let most = vec![(file_ref("/x", "v1", 10), vec![0]); frame::MAX_LOAD_FILES];
        let (body, _) = ask(&pool, h.addr(0), load_files(&most)).await;
        let ResponseBody::FilesLoaded { outcomes } = body else {
            panic!("{body:?}");
        };
        assert_eq!(outcomes.len(), frame::MAX_LOAD_FILES);
        assert!(outcomes
            .iter()
            .all(|o| matches!(o, frame::FileOutcome::Loaded { .. })));
        assert_eq!(h.fake.reads(), 1, "the refused request loaded nothing");
        pool.close();
    });
}

// ---------------------------------------------------------------------------
// Stats of many files of one directory: one listing
// ---------------------------------------------------------------------------

#[test]
fn stats_of_many_files_of_a_directory_are_answered_from_one_listing_within_the_ttl() {
    let ttl = Duration::from_millis(800);
    let h = Harness::start(Setup {
        shards: 1,
        loader: LoaderOptions {
            metadata_ttl: ttl,
            ..LoaderOptions::default()
        },
        ..Default::default()
    });
    let files: Vec<(String, String, Vec<u8>)> = (0..50u64)
        .map(|i| {
            (
                format!("/many/f{i:02}"),
                format!("tag{i}"),
                content(i, 10 + i as usize),
            )
        })
        .collect();
    let listing = |files: &[(String, String, Vec<u8>)]| -> Vec<DirEntry> {
        files
            .iter()
            .map(|(p, v, d)| DirEntry {
                name: p.rsplit_once('/').unwrap().1.to_string(),
                is_dir: false,
                size: d.len() as u64,
                version_tag: v.clone(),
                mtime_ns: MTIME_NS,
            })
            .collect()
    };
    for (p, v, d) in &files {
        h.fake.put_file(p, v, d.clone());
    }
    h.fake.set_dir("/many", listing(&files));
    let stat = |p: &str| RequestBody::StatPath {
        path: p.to_string(),
    };
    let info = |p: &str, v: &str, size: usize| ResponseBody::PathInfo {
        kind: PathKind::File {
            size: size as u64,
            version_tag: v.to_string(),
            file_id: FileId::from_u128(ring::file_id(p, v)),
            mtime_ns: MTIME_NS,
            state: FileState::Stored,
            store_tag: v.to_string(),
        },
    };
    let n = pagestore_server::loader::LIST_AFTER_STATS as u64;
    h.rt.block_on(async {
        let pool = h.pool();
        let addr = h.addr(0);
        for (p, v, d) in &files {
            assert_eq!(
                ask(&pool, addr, stat(p)).await.0,
                info(p, v, d.len()),
                "{p}"
            );
        }
        // The first n - 1 stats went to the store, the n-th listed the directory, and the
        // rest were answered from that listing: exactly what stats would have answered.
        assert_eq!((h.fake.stats(), h.fake.lists()), (n - 1, 1));
        assert_eq!(h.counters().await.dir_listings, 1);

        // A file the listing does not hold (written since) is stat'ed, not refused.
        h.fake.put_file("/many/new", "n1", vec![1; 5]);
        assert_eq!(
            ask(&pool, addr, stat("/many/new")).await.0,
            info("/many/new", "n1", 5)
        );
        assert_eq!(h.fake.stats(), n);

        // An invalidation of one file drops its directory's listing on the shard: the next
        // stat of another file asks the store, which has the rewritten object.
        let (p0, v0, _) = &files[0];
        h.fake.put_file(p0, "tag0b", vec![7; 3]);
        invalidate(&h, addr, p0, v0).await;
        assert_eq!(ask(&pool, addr, stat(p0)).await.0, info(p0, "tag0b", 3));
        // (files[30] was answered from the listing before, not from a stat of its own.)
        let (p1, v1, d1) = &files[30];
        assert_eq!(ask(&pool, addr, stat(p1)).await.0, info(p1, v1, d1.len()));
        assert_eq!(h.fake.stats(), n + 2, "the listing was dropped");

        // Past the TTL nothing is answered from the old listing: a file rewritten meanwhile
        // is seen at its new version.
        tokio::time::sleep(ttl + Duration::from_millis(100)).await;
        let (p2, _, _) = &files[40];
        h.fake.put_file(p2, "tag2b", vec![9; 4]);
        assert_eq!(ask(&pool, addr, stat(p2)).await.0, info(p2, "tag2b", 4));
        assert_eq!(h.fake.lists(), 1);

        // A store whose listing gives no versions (some S3-protocol servers list without
        // ETags): its directory is listed all the same, but every file is stat'ed, and every
        // answer carries the version the stat gives, never the listing's "".
        let untagged: Vec<(String, String, Vec<u8>)> = (0..2 * n)
            .map(|i| (format!("/bare/g{i:02}"), format!("etag{i}"), content(i, 3)))
            .collect();
        for (p, v, d) in &untagged {
            h.fake.put_file(p, v, d.clone());
        }
        let mut blank = listing(&untagged);
        for e in &mut blank {
            e.version_tag.clear();
        }
        h.fake.set_dir("/bare", blank);
        let before = h.fake.stats();
        for (p, v, d) in &untagged {
            assert_eq!(
                ask(&pool, addr, stat(p)).await.0,
                info(p, v, d.len()),
                "{p}"
            );
        }
        assert_eq!(h.fake.lists(), 2, "the directory was listed");
        assert_eq!(h.fake.stats() - before, 2 * n, "every file was stat'ed");
        pool.close();
    });
}

/// A path has one spelling on the wire: `/m//a` (which stores read as `m/a`) is refused before
/// any store is asked, and `/m/a/` names a directory only, answered from the same cache as
/// `/m/a` (a second spelling would be a second cached copy of one object).
#[test]
fn a_path_is_asked_about_in_one_spelling() {
    let h = Harness::start(Setup::default());
    h.fake.put_file("/m/a", "v1", vec![1; 1000]);
    let entry = |name: &str| DirEntry {
        name: name.to_string(),
        is_dir: false,
        size: 1,
        version_tag: "v1".into(),
        mtime_ns: MTIME_NS,
    };
    h.fake.set_dir("/d", vec![entry("x"), entry("y")]);
    let addr = h.addr(0);
    let stat = |p: &str| RequestBody::StatPath { path: p.into() };
    let list = |p: &str| RequestBody::List {
        path: p.into(),
        start_after: String::new(),
    };
    h.rt.block_on(async {
        let pool = h.pool();
        for bad in ["/m//a", "//m/a", "/m/a//", "/m/./a", "m/a"] {
            let (body, _) = ask(&pool, addr, stat(bad)).await;
            assert_error(&body, ErrorCode::BadRequest);
            let (body, _) = ask(&pool, addr, list(bad)).await;
            assert_error(&body, ErrorCode::BadRequest);
        }
        assert_eq!(
            (h.fake.stats(), h.fake.lists()),
            (0, 0),
            "a refused path reached the store"
        );
        let (body, _) = ask(&pool, addr, stat("/m/a")).await;
        assert!(matches!(
            body,
            ResponseBody::PathInfo {
                kind: PathKind::File { size: 1000, .. }
            }
        ));
        // A file named as a directory is not there; asked from what `/m/a` cached.
        let (body, _) = ask(&pool, addr, stat("/m/a/")).await;
        assert_error(&body, ErrorCode::NotFound);
        assert_eq!(h.fake.stats(), 1, "/m/a/ was asked of the store apart");
        let (body, _) = ask(&pool, addr, stat("/m/")).await;
        assert_eq!(
            body,
            ResponseBody::PathInfo {
                kind: PathKind::DIR
            }
        );
        // One listing of `/d` serves both spellings.
        let names = |body: ResponseBody| match body {
            ResponseBody::Listing { entries, .. } => {
                entries.into_iter().map(|e| e.name).collect::<Vec<_>>()
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(names(ask(&pool, addr, list("/d/")).await.0), ["x", "y"]);
        assert_eq!(names(ask(&pool, addr, list("/d")).await.0), ["x", "y"]);
        assert_eq!(h.fake.lists(), 1);
        pool.close();
    });
}
