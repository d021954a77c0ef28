//! A node's serving side: the engine's shards, each with its own QUIC endpoint on
//! `base port + shard index`, serving pages from its own slice of the cache.

use std::{
    cell::RefCell,
    net::SocketAddr,
    rc::Rc,
    sync::{mpsc, Arc, Mutex},
    time::Duration,
};

use pagestore_engine::{Engine, EngineConfig, EngineError, Shard, ShardInit, StartError};

use crate::{
    endpoint::{self, EndpointHandle, EndpointOptions, Limits, RequestBudget},
    frame::NodeEntry,
    jobs::JobBoard,
    loader::{Loader, LoaderOptions},
    ring::{MemberId, Ring},
    service::{RingView, ShardService},
    source::Source,
    spread::SpreadConfig,
    writeback::WriteBack,
};
use pagestore_engine::DirtyFile;
use pagestore_protocol::frame::PageAction;

/// The under storage a node loads misses from, and the tokio runtime its requests run on.
#[derive(Clone)]
pub struct NodeSource {
    /// The store.
    pub source: Arc<dyn Source>,
    /// Where the store's futures run (a runtime the caller keeps alive while the node runs).
    pub runtime: tokio::runtime::Handle,
    /// Per-shard limits and the metadata TTL.
    pub options: LoaderOptions,
}

/// How a node serves.
#[derive(Clone)]
pub struct NodeOptions {
    /// Base address: shard `i` listens on port `port + i` (port 0: every shard picks a free port).
    pub listen: SocketAddr,
    /// TLS and transport settings of the endpoints.
    pub server: Arc<quinn_proto::ServerConfig>,
    /// This node's UUID.
    pub node_id: u128,
    /// The ring the shards start with (an empty ring: serve every key).
    pub ring: Arc<Ring>,
    /// Largest request accepted.
    pub max_request: usize,
    /// Request bytes one connection may have buffered at once (see [`EndpointOptions`]).
    pub max_buffered: usize,
    /// Connection, handshake, request-budget and stall limits of the endpoints.
    pub limits: Limits,
    /// The under storage (none: a pure cache that answers misses with `Miss`/`Unavailable`).
    pub source: Option<NodeSource>,
    /// The cluster's nodes, as the `Cluster` request reports them.
    pub nodes: Vec<NodeEntry>,
    /// Replicas clients may try before the under storage.
    pub replicas: u8,
    /// The node's write-back side (none: write-back requests are `Unavailable`).
    pub writeback: Option<Arc<dyn WriteBack>>,
    /// Bytes of the memory tier over all shards (each shard keeps its share; 0: none).
    pub memory_cache: u64,
    /// Hot-page replicas: when a page is hot, over how many members it is spread, and when
    /// copies are dropped.
    pub spread: SpreadConfig,
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The engine could not start.
    #[error(transparent)]
    Engine(#[from] StartError),
    /// A shard could not bind its UDP port.
    #[error(
        "cannot listen on {0} (UDP): {1}; shard ports are the base port plus the shard index, so \
         the whole range must be free"
    )]
    Bind(SocketAddr, #[source] std::io::Error),
    /// A shard did not report in time.
    #[error("a shard did not start its endpoint in time")]
    Timeout,
}

/// One shard's network state: its endpoint, ring view, miss path and service (opaque outside
/// this module; reached through [`Node`]'s methods).
pub struct ShardNet {
    endpoint: Rc<EndpointHandle>,
    view: Rc<RingView>,
    loader: Option<Rc<Loader>>,
    service: Rc<ShardService>,
}

/// Upper bounds, in microseconds, of the request service-time histogram that
/// [`ShardMetrics::latency_buckets`] counts (from 50 µs, a page hit on an idle shard, to 5 s).
pub const LATENCY_BOUNDS_US: [u64; 16] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000,
];

/// Everything one shard reports for monitoring ([`Node::metrics`]).
#[derive(Clone, Debug, Default)]
pub struct ShardMetrics {
    /// The engine's counters.
    pub engine: pagestore_engine::ShardStats,
    /// The miss path's counters.
    pub loader: LoaderCounters,
    /// Requests served by the shard's endpoint.
    pub requests: u64,
    /// Request service time, microseconds: p50, p90, p99, p99.9, max.
    pub latency_us: [u64; 5],
    /// Sum of request service times, microseconds.
    pub latency_sum_us: u64,
    /// Requests by service time: entry `i` counts those above `LATENCY_BOUNDS_US[i - 1]` and
    /// at most `LATENCY_BOUNDS_US[i]` microseconds; the last entry counts the rest.
    pub latency_buckets: [u64; LATENCY_BOUNDS_US.len() + 1],
    /// The ring epoch the shard serves under.
    pub epoch: u64,
    /// `Fetch` requests served as a replica because a client's owner failed.
    pub replica_reads: u64,
    /// `NotOwner` answers.
    pub not_owner: u64,
    /// Requests refused because the peer's role did not allow them.
    pub forbidden: u64,
    /// The shard's QUIC endpoint.
    pub endpoint: EndpointCounters,
    /// The memory tier's counters (zero without one).
    pub memory: crate::memory::MemoryStats,
    /// Bytes sent from the memory tier.
    pub memory_hit_bytes: u64,
    /// Page bytes sent to clients, from anywhere.
    pub served_bytes: u64,
    /// Bytes per mount: served from the cache, read from the store, and the egress price.
    pub mounts: Vec<crate::frame::MountBytes>,
    /// Pages the shard owns that are hot now, and that turned hot since start.
    pub hot_now: u64,
    /// See [`ShardMetrics::hot_now`].
    pub hot_turned: u64,
    /// Its copies of other owners' hot pages.
    pub replicas: crate::spread::ReplicaCounts,
}

/// Counters of one shard's QUIC endpoint ([`Node::endpoint_counters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndpointCounters {
    /// Connections accepted.
    pub connections: u64,
    /// Connection attempts refused by the connection or handshake limits.
    pub refused: u64,
    /// Retry packets sent (address validation).
    pub retries: u64,
    /// Requests reset because their bytes stopped arriving.
    pub stalled: u64,
    /// Times a request waited for the node's request budget.
    pub budget_waits: u64,
    /// Streams reset because a request was too large or malformed.
    pub rejected: u64,
    /// Requests whose payload (of 64 KiB up to a page: a page to write, or a large batch of
    /// replicated records) was received straight into a buffer aligned for the disk.
    pub payloads_apart: u64,
}

/// Miss-path counters of one shard (see [`crate::loader::LoaderStats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoaderCounters {
    /// Page loads sent to the under storage.
    pub ufs_reads: u64,
    /// Bytes read from the under storage.
    pub ufs_bytes: u64,
    /// Failed under-storage requests.
    pub ufs_errors: u64,
    /// Misses that joined a load in flight.
    pub coalesced: u64,
    /// Metadata answers from the TTL cache.
    pub metadata_hits: u64,
    /// Metadata requests sent to the store.
    pub metadata_misses: u64,
    /// Loaded pages served but not kept (cache or rule quota full, or a disk error).
    pub store_failures: u64,
    /// Page loads of a page loaded recently already (see [`crate::loader::RECENT_LOADS`]).
    pub ufs_repeat_reads: u64,
    /// Hot pages copied from their owner (peer to peer).
    pub owner_copies: u64,
    /// Copies the owner could not give (the reader asked the owner itself).
    pub owner_copy_failures: u64,
    /// Directories listed to answer their files' stats (`loader::LIST_AFTER_STATS`).
    pub dir_listings: u64,
}

/// What each shard keeps beside its cache: its network state, from the engine's init hook
/// until shutdown takes it (`None` if its endpoint could not start).
pub type ShardState = RefCell<Option<ShardNet>>;

/// A running node.
pub struct Node {
    engine: Option<Engine<ShardState>>,
    addrs: Vec<SocketAddr>,
    node_id: u128,
    jobs: Arc<JobBoard>,
    budget: Arc<RequestBudget>,
    reply_budget: Arc<RequestBudget>,
}

/// Drops the shard's cooled hot-page copies every [`ShardService::sweep_period`], until the
/// service is gone (the shard stopped).
fn sweep_copies(service: std::rc::Weak<ShardService>) {
    glommio::spawn_local(async move {
        loop {
            let Some(period) = service.upgrade().map(|s| s.sweep_period()) else {
                return;
            };
            glommio::timer::sleep(period).await;
            let Some(s) = service.upgrade() else {
                return;
            };
            s.drop_cooled_copies().await;
        }
    })
    .detach();
}

fn shard_addr(base: SocketAddr, shard: usize) -> SocketAddr {
    let mut a = base;
    if base.port() != 0 {
        a.set_port(base.port().saturating_add(shard as u16));
    }
    a
}

impl Node {
    /// Starts the engine and one endpoint per shard.
    pub fn start(engine: EngineConfig, options: NodeOptions) -> Result<Node, NodeError> {
        let shards = engine.resolved_shards();
        let per_shard = options.memory_cache / shards.max(1) as u64;
        if options.memory_cache > 0 && per_shard < u64::from(engine.page_size) {
            tracing::warn!(
                memory_cache = options.memory_cache,
                shards,
                page_size = engine.page_size,
                "the memory tier gives each shard less than one page: it will hold nothing"
            );
        }
        type Report = (usize, Result<SocketAddr, (SocketAddr, std::io::Error)>);
        let (tx, rx) = mpsc::channel::<Report>();
        let tx = Arc::new(Mutex::new(tx));
        let opts = options.clone();
        let jobs = Arc::new(JobBoard::default());
        let board = jobs.clone();
        // One budget for the whole node; it must hold at least one whole request.
        let budget = RequestBudget::new(options.limits.max_partial_bytes.max(options.max_request));
        let shared = budget.clone();
        // Replies get a budget of the same size of their own (see `EndpointOptions`).
        let reply_budget = RequestBudget::new(budget.limit());
        let shared_replies = reply_budget.clone();
        let init: ShardInit<ShardState> = Arc::new(move |shard: Rc<Shard>| {
            let id = shard.id();
            let addr = shard_addr(opts.listen, id);
            let view = Rc::new(RingView {
                me: MemberId {
                    node: opts.node_id,
                    shard: id as u16,
                },
                ring: RefCell::new(opts.ring.clone()),
                nodes: RefCell::new(Arc::new(opts.nodes.clone())),
                replicas: opts.replicas,
            });
            let loader = opts.source.as_ref().map(|s| {
                Loader::new(
                    shard.clone(),
                    s.source.clone(),
                    s.runtime.clone(),
                    s.options.clone(),
                )
            });
            let memory = opts.memory_cache / shards.max(1) as u64;
            let service =
                ShardService::new(shard, view.clone(), loader.clone(), memory, opts.spread);
            if opts.spread.enabled() {
                sweep_copies(Rc::downgrade(&service));
            }
            service.set_jobs(board.clone());
            if let Some(wb) = &opts.writeback {
                service.set_writeback(wb.clone());
            }
            let service_ref = service.clone();
            let ep = endpoint::start(
                EndpointOptions {
                    addr,
                    server: opts.server.clone(),
                    max_request: opts.max_request,
                    max_buffered: opts.max_buffered,
                    limits: opts.limits.clone(),
                    budget: shared.clone(),
                    reply_budget: shared_replies.clone(),
                },
                service,
            );
            let (report, net) = match ep {
                Ok(ep) => {
                    let local = ep.local_addr();
                    let net = ShardNet {
                        endpoint: Rc::new(ep),
                        view,
                        loader,
                        service: service_ref,
                    };
                    (Ok(local), Some(net))
                }
                Err(e) => (Err((addr, e)), None),
            };
            if let Ok(tx) = tx.lock() {
                let _ = tx.send((id, report));
            }
            RefCell::new(net)
        });
        let engine = Engine::start_with(engine, init).map_err(NodeError::Engine)?;
        let mut node = Node {
            engine: Some(engine),
            addrs: vec![options.listen; shards],
            node_id: options.node_id,
            jobs,
            budget,
            reply_budget,
        };
        for _ in 0..shards {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok((id, Ok(addr))) => node.addrs[id] = addr,
                Ok((_, Err((addr, e)))) => {
                    let _ = node.shutdown_inner();
                    return Err(NodeError::Bind(addr, e));
                }
                Err(_) => {
                    let _ = node.shutdown_inner();
                    return Err(NodeError::Timeout);
                }
            }
        }
        Ok(node)
    }

    /// The address of each shard's endpoint, by shard index.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// This node's UUID.
    pub fn node_id(&self) -> u128 {
        self.node_id
    }

    /// The preload job records clients reported to this node.
    pub fn jobs(&self) -> &JobBoard {
        &self.jobs
    }

    /// The engine (for local access and stats).
    pub fn engine(&self) -> Option<&Engine<ShardState>> {
        self.engine.as_ref()
    }

    /// Gives every shard a new ring and node list (after a membership change). Requests in
    /// flight finish under the ring they started with.
    pub async fn set_ring(
        &self,
        ring: Arc<Ring>,
        nodes: Arc<Vec<NodeEntry>>,
    ) -> Result<(), EngineError> {
        let Some(engine) = &self.engine else {
            return Err(EngineError::ShardGone);
        };
        for h in engine.shards() {
            let (r, n) = (ring.clone(), nodes.clone());
            h.run_with(move |_, state| async move {
                if let Some(net) = state.borrow().as_ref() {
                    *net.view.ring.borrow_mut() = r;
                    *net.view.nodes.borrow_mut() = n;
                }
            })
            .await?;
        }
        Ok(())
    }

    /// Counts every write-back version with dirty pages on this node as recovered
    /// ([`ShardService::suspect_dirty`]): etcd counted this node down, so writers may have
    /// written newer bytes of those pages to other members meanwhile. Returns the versions
    /// counted, summed over the shards.
    pub async fn suspect_dirty(&self) -> Result<usize, EngineError> {
        let counts = self
            .on_each_shard(|_, net| net.map_or(0, |n| n.service.suspect_dirty()))
            .await?;
        Ok(counts.into_iter().sum())
    }

    /// Runs `f` on every shard, with that shard and its network state (`None` before its
    /// endpoint starts or after it stops), and collects the results by shard index.
    async fn on_each_shard<T: Send + 'static>(
        &self,
        f: fn(&Shard, Option<&ShardNet>) -> T,
    ) -> Result<Vec<T>, EngineError> {
        let Some(engine) = &self.engine else {
            return Err(EngineError::ShardGone);
        };
        let mut v = Vec::new();
        for h in engine.shards() {
            v.push(
                h.run_with(move |shard, state| async move { f(&shard, state.borrow().as_ref()) })
                    .await?,
            );
        }
        Ok(v)
    }

    /// Does `action` to the pages of write-back version `file_id` on every shard of this node
    /// (the same as a `FilePages` request to each). Returns the pages affected.
    pub async fn file_pages(&self, file_id: u128, action: PageAction) -> Result<u64, EngineError> {
        self.each_service(move |s| async move { s.page_action(file_id, action).await })
            .await
    }

    /// Retires the pages of write-back version `file_id`, replaced or deleted, on every shard
    /// of this node ([`ShardService::retire`]). Returns the pages demoted.
    pub async fn retire_file(&self, file_id: u128) -> Result<u64, EngineError> {
        self.each_service(move |s| async move { s.retire(file_id).await })
            .await
    }

    /// Runs `f` on every shard's service in turn; the sum of what it returned.
    async fn each_service<F, Fut>(&self, f: F) -> Result<u64, EngineError>
    where
        F: Fn(Rc<ShardService>) -> Fut + Clone + Send + 'static,
        Fut: std::future::Future<Output = Result<usize, EngineError>>,
    {
        let Some(engine) = &self.engine else {
            return Err(EngineError::ShardGone);
        };
        let mut n = 0;
        for h in engine.shards() {
            let f = f.clone();
            n += h
                .run_with(move |_, state| async move {
                    let service = state.borrow().as_ref().map(|net| net.service.clone());
                    match service {
                        Some(s) => f(s).await,
                        None => Err(EngineError::ShardGone),
                    }
                })
                .await??;
        }
        Ok(n as u64)
    }

    /// The dirty pages every shard holds, by file, over all shards.
    pub async fn dirty_files(&self) -> Result<Vec<DirtyFile>, EngineError> {
        let mut by_file: std::collections::BTreeMap<u128, DirtyFile> = Default::default();
        for files in self.on_each_shard(|shard, _| shard.dirty_files()).await? {
            for f in files {
                let e = by_file.entry(f.file_id).or_insert(DirtyFile {
                    file_id: f.file_id,
                    pages: 0,
                    bytes: 0,
                    newest_ms: 0,
                });
                e.pages += f.pages;
                e.bytes += f.bytes;
                e.newest_ms = e.newest_ms.max(f.newest_ms);
            }
        }
        Ok(by_file.into_values().collect())
    }

    /// Makes every shard forget what it cached of the metadata of `paths` (and of their parent
    /// directories' listings): their records changed.
    pub async fn forget_paths(&self, paths: Vec<String>) -> Result<(), EngineError> {
        let Some(engine) = &self.engine else {
            return Err(EngineError::ShardGone);
        };
        let paths = Arc::new(paths);
        for h in engine.shards() {
            let paths = paths.clone();
            h.run_with(move |_, state| async move {
                if let Some(loader) = state.borrow().as_ref().and_then(|n| n.loader.as_ref()) {
                    for p in paths.iter() {
                        loader.forget(p);
                    }
                }
            })
            .await?;
        }
        Ok(())
    }

    /// Requests served by each shard's endpoint so far.
    pub async fn requests_served(&self) -> Result<Vec<u64>, EngineError> {
        self.on_each_shard(|_, net| net.map_or(0, |n| n.endpoint.stats().requests.get()))
            .await
    }

    /// Request bytes the node's endpoints hold now (partly received requests and requests
    /// being served), out of [`Limits::max_partial_bytes`].
    pub fn partial_bytes(&self) -> usize {
        self.budget.used()
    }

    /// Reply bytes the node's endpoints hold now (reserved for requests being served, and
    /// replies not yet acknowledged by their peers), out of [`Limits::max_partial_bytes`].
    pub fn reply_bytes(&self) -> usize {
        self.reply_budget.used()
    }

    /// Each shard endpoint's connection, Retry, stall and budget counters, by shard index.
    pub async fn endpoint_counters(&self) -> Result<Vec<EndpointCounters>, EngineError> {
        self.on_each_shard(|_, net| endpoint_counters(net)).await
    }

    /// Everything each shard reports for monitoring, by shard index.
    pub async fn metrics(&self) -> Result<Vec<ShardMetrics>, EngineError> {
        self.on_each_shard(|shard, net| {
            let mut m = ShardMetrics {
                engine: shard.stats(),
                loader: loader_counters(net),
                endpoint: endpoint_counters(net),
                ..ShardMetrics::default()
            };
            if let Some(net) = net {
                let h = net.service.latency();
                let q = |x: f64| h.value_at_quantile(x);
                m.requests = net.endpoint.stats().requests.get();
                m.latency_us = [q(0.5), q(0.9), q(0.99), q(0.999), h.max()];
                m.latency_sum_us = (h.mean() * h.len() as f64) as u64;
                for v in h.iter_recorded() {
                    let le = LATENCY_BOUNDS_US.partition_point(|&b| b < v.value_iterated_to());
                    m.latency_buckets[le] += v.count_at_value();
                }
                m.epoch = net.view.epoch();
                (m.replica_reads, m.not_owner) = net.service.routing_counters();
                m.forbidden = net.service.forbidden();
                (m.memory, m.memory_hit_bytes) = net.service.memory_stats();
                m.served_bytes = net.service.served_bytes();
                m.mounts = net.service.hot_report().mounts;
                let (hot_now, hot_turned, replicas) = net.service.spread_stats();
                (m.hot_now, m.hot_turned, m.replicas) = (hot_now.into(), hot_turned, replicas);
            }
            m
        })
        .await
    }

    /// Each shard's hottest files and pages and bytes per mount (what `Hot` answers), by
    /// shard index.
    pub async fn hot_reports(&self) -> Result<Vec<crate::frame::HotReport>, EngineError> {
        self.on_each_shard(|shard, net| {
            net.map_or_else(
                || crate::frame::HotReport {
                    shard: shard.id() as u16,
                    ..Default::default()
                },
                |n| n.service.hot_report(),
            )
        })
        .await
    }

    /// Miss-path counters of each shard, by shard index.
    pub async fn loader_counters(&self) -> Result<Vec<LoaderCounters>, EngineError> {
        self.on_each_shard(|_, net| loader_counters(net)).await
    }

    /// Closes every connection (clients get an error, not a hang), then stops the shards.
    pub fn shutdown(mut self) -> Result<(), EngineError> {
        self.shutdown_inner()
    }

    fn shutdown_inner(&mut self) -> Result<(), EngineError> {
        let Some(engine) = self.engine.take() else {
            return Ok(());
        };
        for h in engine.shards() {
            let _ = futures_lite::future::block_on(h.run_with(|_, state| async move {
                let ep = state.borrow_mut().take().map(|net| net.endpoint);
                if let Some(ep) = ep {
                    ep.close().await;
                }
            }));
        }
        engine.shutdown()
    }
}

fn loader_counters(net: Option<&ShardNet>) -> LoaderCounters {
    net.and_then(|n| n.loader.as_ref())
        .map_or_else(LoaderCounters::default, |l| {
            let s = l.stats();
            LoaderCounters {
                ufs_reads: s.ufs_reads.get(),
                ufs_bytes: s.ufs_bytes.get(),
                ufs_errors: s.ufs_errors.get(),
                coalesced: s.coalesced.get(),
                metadata_hits: s.metadata_hits.get(),
                metadata_misses: s.metadata_misses.get(),
                store_failures: s.store_failures.get(),
                ufs_repeat_reads: s.ufs_repeat_reads.get(),
                owner_copies: s.owner_copies.get(),
                owner_copy_failures: s.owner_copy_failures.get(),
                dir_listings: s.dir_listings.get(),
            }
        })
}

fn endpoint_counters(net: Option<&ShardNet>) -> EndpointCounters {
    net.map_or_else(EndpointCounters::default, |n| {
        let s = n.endpoint.stats();
        EndpointCounters {
            connections: s.connections.get(),
            refused: s.refused.get(),
            retries: s.retries.get(),
            stalled: s.stalled.get(),
            budget_waits: s.budget_waits.get(),
            rejected: s.rejected.get(),
            payloads_apart: s.payloads_apart.get(),
        }
    })
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown_inner() {
            tracing::error!(error = %e, "node shutdown");
        }
    }
}
