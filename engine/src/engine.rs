//! Starting shards on their cores and reaching them from other threads.

use std::{
    fs::File,
    future::Future,
    path::PathBuf,
    pin::Pin,
    rc::Rc,
    sync::{mpsc, Arc},
    time::Instant,
};

use futures_channel::oneshot;
use glommio::{ExecutorJoinHandle, LocalExecutorBuilder, Placement};

use crate::{
    cachefile::CacheFile,
    config::EngineConfig,
    error::{EngineError, Result, StartError},
    format::{FileIdent, Geometry},
    index::{Index, RuleStats},
    key::PageKey,
    policy::new_policy,
    rules::Rules,
    shard::{PageInfo, PutOutcome, Shard},
    stats::ShardStats,
};

type Job<S> = Box<dyn FnOnce(Rc<Shard>, Rc<S>) -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// Code to run on every shard once it is up, on the shard's thread: it returns the state the
/// shard keeps beside its cache for the engine's user (the network layer's endpoint and ring
/// view), which [`ShardHandle::run_with`] hands to later jobs. The state never leaves the
/// shard's thread, so it need not be `Send`.
pub type ShardInit<S> = Arc<dyn Fn(Rc<Shard>) -> S + Send + Sync>;

/// A running engine: one pinned executor thread per shard, each keeping a state of type `S`
/// made by the [`ShardInit`] hook (none by default).
///
/// Dropping it shuts the shards down (in-flight requests finish, files are synced).
pub struct Engine<S: 'static = ()> {
    handles: Vec<ShardHandle<S>>,
    threads: Vec<ExecutorJoinHandle<Result<()>>>,
    page_size: u32,
    rules: Arc<Rules>,
    _locks: Vec<File>,
}

/// A `Send + Sync` handle to one shard. Each call ships a closure to the shard's thread and
/// awaits its answer, so it works from any thread or async runtime.
pub struct ShardHandle<S: 'static = ()> {
    id: usize,
    tx: async_channel::Sender<Job<S>>,
}

impl<S> Clone for ShardHandle<S> {
    fn clone(&self) -> Self {
        ShardHandle {
            id: self.id,
            tx: self.tx.clone(),
        }
    }
}

impl<S: 'static> ShardHandle<S> {
    /// The shard's index.
    pub fn id(&self) -> usize {
        self.id
    }

    /// Runs `f` on the shard's executor and returns its result. `f` is `Send`; the future it
    /// returns need not be.
    pub async fn run<F, Fut, T>(&self, f: F) -> Result<T>
    where
        F: FnOnce(Rc<Shard>) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
        T: Send + 'static,
    {
        self.run_with(move |shard, _| f(shard)).await
    }

    /// Runs `f` on the shard's executor with the shard and its state (what the
    /// [`ShardInit`] hook returned), and returns its result.
    pub async fn run_with<F, Fut, T>(&self, f: F) -> Result<T>
    where
        F: FnOnce(Rc<Shard>, Rc<S>) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job<S> = Box::new(move |shard: Rc<Shard>, state: Rc<S>| {
            Box::pin(async move {
                let _ = tx.send(f(shard, state).await);
            })
        });
        self.tx
            .send(job)
            .await
            .map_err(|_| EngineError::ShardGone)?;
        rx.await.map_err(|_| EngineError::ShardGone)
    }

    /// Reads part of a page into a new vector (see [`Shard::get`]).
    pub async fn get(&self, key: PageKey, offset: u32, len: u32) -> Result<Option<Vec<u8>>> {
        self.run(move |s| async move { Ok(s.get(&key, offset, len).await?.map(|d| d.to_vec())) })
            .await?
    }

    /// Stores a page (see [`Shard::put`]).
    pub async fn put(&self, key: PageKey, data: Vec<u8>, version: u64) -> Result<PutOutcome> {
        self.run(move |s| async move { s.put(&key, &data, version).await })
            .await?
    }

    /// Stores a page of rule number `rule` (see [`Shard::put_in_rule`]).
    pub async fn put_in_rule(
        &self,
        key: PageKey,
        data: Vec<u8>,
        version: u64,
        rule: u8,
    ) -> Result<PutOutcome> {
        self.run(move |s| async move { s.put_in_rule(&key, &data, version, rule).await })
            .await?
    }

    /// Accounting of every rule on this shard, by rule number (see [`Shard::rule_stats`]).
    pub async fn rule_stats(&self) -> Result<Vec<RuleStats>> {
        self.run(|s| async move { s.rule_stats() }).await
    }

    /// Whether a page is cached.
    pub async fn contains(&self, key: PageKey) -> Result<bool> {
        self.run(move |s| async move { s.contains(&key) }).await
    }

    /// What the index knows about a page.
    pub async fn page_info(&self, key: PageKey) -> Result<Option<PageInfo>> {
        self.run(move |s| async move { s.page_info(&key) }).await
    }

    /// Removes a page.
    pub async fn remove(&self, key: PageKey) -> Result<bool> {
        self.run(move |s| async move { s.remove(&key).await })
            .await?
    }

    /// Removes every page of a file held by this shard.
    pub async fn remove_file(&self, file_id: u128) -> Result<usize> {
        self.run(move |s| async move { s.remove_file(file_id).await })
            .await?
    }

    /// Pins or unpins a page.
    pub async fn set_pinned(&self, key: PageKey, pinned: bool) -> Result<bool> {
        self.run(move |s| async move { s.set_pinned(&key, pinned).await })
            .await?
    }

    /// Counters and occupancy.
    pub async fn stats(&self) -> Result<ShardStats> {
        self.run(|s| async move { s.stats() }).await
    }
}

fn lock_dir(dir: &std::path::Path) -> Result<File, StartError> {
    use std::os::fd::AsRawFd;
    let path = dir.join("pagestore.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| StartError::io("creating lock file", Some(path.clone()), e))?;
    // A flock belongs to the open file, which a process forked elsewhere in this process
    // shares until it execs (the descriptor is close-on-exec): a lock just released by an
    // engine that stopped can look held for that moment. So a held lock is tried again for a
    // short while before the directory counts as in use by another process.
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        // SAFETY: flock on a file descriptor we own; the lock dies with the process.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(f);
        }
        if std::time::Instant::now() >= deadline {
            return Err(StartError::CacheInUse { path });
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// How long a start waits for the cache directory's lock (see [`lock_dir`]).
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// The CPUs this process may run on, in order.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it for the current thread.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the pointer and size describe `set`, which lives for the call.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if rc != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `i` is below CPU_SETSIZE, the size of `set`.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

impl Engine {
    /// Starts an engine whose shards keep no state of the user's.
    pub fn start(config: EngineConfig) -> Result<Engine, StartError> {
        Engine::start_with(config, Arc::new(|_| ()))
    }
}

impl<S: 'static> Engine<S> {
    /// Starts an engine and runs `init` on every shard's executor once it has recovered; what
    /// it returns is the shard's state (see [`ShardHandle::run_with`]).
    pub fn start_with(config: EngineConfig, init: ShardInit<S>) -> Result<Engine<S>, StartError> {
        config.validate()?;
        crate::probe::probe_io_uring()?;
        let shards = config.resolved_shards();
        let dirs = config.cache_dirs.len();
        let per_file = config.capacity / (shards * dirs) as u64;
        let geo = Geometry::for_capacity(config.page_size, config.chunk_size, per_file)
            .ok_or_else(|| {
                StartError::Config(format!(
                    "capacity {} split over {shards} shards x {dirs} directories leaves {per_file} \
                     bytes per cache file, less than one {}-byte page plus metadata",
                    config.capacity, config.page_size
                ))
            })?;

        let mut locks = Vec::new();
        for dir in &config.cache_dirs {
            std::fs::create_dir_all(dir)
                .map_err(|e| StartError::io("creating cache directory", Some(dir.clone()), e))?;
            locks.push(lock_dir(dir)?);
            crate::probe::probe_direct_io(dir)?;
            check_space(dir, shards, geo.file_size)?;
        }

        let io_memory = config.page_size as usize * config.queue_depth;
        crate::probe::raise_memlock((io_memory as u64 + (1 << 20)) * shards as u64 + (8 << 20));
        let cpus = allowed_cpus();
        let (ready_tx, ready_rx) = mpsc::channel::<(usize, Result<(), StartError>)>();
        let mut handles = Vec::new();
        let mut threads = Vec::new();
        for id in 0..shards {
            let (tx, rx) = async_channel::bounded::<Job<S>>(config.max_inflight);
            handles.push(ShardHandle { id, tx });
            let placement = match (config.pin_cpus, cpus.get(id % cpus.len().max(1))) {
                (true, Some(&cpu)) if shards <= cpus.len() => Placement::Fixed(cpu),
                _ => Placement::Unbound,
            };
            let cfg = config.clone();
            let init = init.clone();
            let ready = ready_tx.clone();
            let builder = LocalExecutorBuilder::new(placement)
                .name(&format!("pagestore-shard-{id}"))
                .io_memory(io_memory);
            let spawned = builder.spawn(move || async move {
                let shard = match open_shard(id, shards, &cfg, geo).await {
                    Ok(s) => Rc::new(s),
                    Err(e) => {
                        let _ = ready.send((id, Err(e)));
                        return Ok(());
                    }
                };
                let state = Rc::new(init(shard.clone()));
                let _ = ready.send((id, Ok(())));
                serve(shard, state, rx, cfg.max_inflight).await
            });
            match spawned {
                Ok(h) => threads.push(h),
                Err(e) => {
                    return Err(StartError::io(
                        "starting shard executor",
                        None,
                        crate::device::to_io(e),
                    ))
                }
            }
        }
        drop(ready_tx);
        let mut engine = Engine {
            handles,
            threads,
            page_size: config.page_size,
            rules: config.rules.clone(),
            _locks: locks,
        };
        let mut first_err = None;
        for _ in 0..shards {
            match ready_rx.recv() {
                Ok((_, Ok(()))) => {}
                Ok((_, Err(e))) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    // A shard thread died before reporting (e.g. its executor could not be
                    // built); its own error comes back when the threads are joined.
                    first_err.get_or_insert(StartError::Shard(EngineError::ShardGone));
                    break;
                }
            }
        }
        if let Some(e) = first_err {
            let joined = engine.stop();
            return Err(match (e, joined) {
                (StartError::Shard(EngineError::ShardGone), Err(real)) => real.into(),
                (e, _) => e,
            });
        }
        Ok(engine)
    }

    /// Handles to every shard, by index.
    pub fn shards(&self) -> &[ShardHandle<S>] {
        &self.handles
    }

    /// The cache's page size.
    pub fn page_size(&self) -> u32 {
        self.page_size
    }

    /// The rule table the shards enforce.
    pub fn rules(&self) -> &Arc<Rules> {
        &self.rules
    }

    /// The shard a key belongs to when the engine is used on its own (without the cluster ring):
    /// `hash64(key) % shards`.
    pub fn shard_of(&self, key: &PageKey) -> &ShardHandle<S> {
        &self.handles[(key.hash64() % self.handles.len() as u64) as usize]
    }

    /// Counters of every shard.
    pub async fn stats(&self) -> Result<Vec<ShardStats>> {
        let mut v = Vec::with_capacity(self.handles.len());
        for h in &self.handles {
            v.push(h.stats().await?);
        }
        Ok(v)
    }

    /// Stops accepting requests, lets in-flight ones finish, syncs and closes the cache files.
    pub fn shutdown(mut self) -> Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> Result<()> {
        for h in &self.handles {
            h.tx.close();
        }
        let mut first = Ok(());
        for t in self.threads.drain(..) {
            let r = t.join().unwrap_or_else(|e| {
                Err(EngineError::io(
                    "running shard",
                    None,
                    crate::device::to_io(e),
                ))
            });
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

impl<S: 'static> Drop for Engine<S> {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::error!(error = %e, "engine shutdown");
        }
    }
}

fn check_space(dir: &std::path::Path, shards: usize, file_size: u64) -> Result<(), StartError> {
    let mut needed = 0u64;
    for id in 0..shards {
        let existing = std::fs::metadata(shard_file(dir, id)).map_or(0, |m| m.len());
        needed += file_size.saturating_sub(existing);
    }
    let free = crate::probe::free_space(dir)
        .map_err(|e| StartError::io("checking free space of", Some(dir.to_path_buf()), e))?;
    if needed > free {
        return Err(StartError::NoSpace {
            path: dir.to_path_buf(),
            needed,
            available: free,
        });
    }
    Ok(())
}

/// The cache file of shard `id` in a cache directory.
pub fn shard_file(dir: &std::path::Path, id: usize) -> PathBuf {
    dir.join(format!("shard-{id}.cache"))
}

async fn open_shard(
    id: usize,
    shards: usize,
    cfg: &EngineConfig,
    geo: Geometry,
) -> Result<Shard, StartError> {
    let started = Instant::now();
    let mut files = Vec::new();
    for (d, dir) in cfg.cache_dirs.iter().enumerate() {
        let ident = FileIdent {
            shard: id as u32,
            shards: shards as u32,
            dir: d as u32,
            dirs: cfg.cache_dirs.len() as u32,
        };
        let path = shard_file(dir, id);
        files.push(
            CacheFile::open(
                &path,
                geo,
                ident,
                cfg.reformat,
                cfg.disk_hooks.clone(),
                &cfg.rules,
            )
            .await?,
        );
    }
    let nslots = geo.nslots * files.len() as u32;
    let limits = cfg.rules.limits(shards, cfg.page_size)?;
    let index = Index::with_rules(nslots, new_policy(cfg.policy, nslots), &limits);
    let shard = Shard::new(
        id,
        files,
        index,
        started,
        cfg.rules.clone(),
        cfg.dirty_limit_per_shard(),
    );
    let st = shard.stats();
    tracing::info!(
        shard = id,
        pages = st.recovered_pages,
        dropped = st.recovery_dropped,
        micros = st.recovery_micros,
        "shard ready"
    );
    Ok(shard)
}

async fn serve<S>(
    shard: Rc<Shard>,
    state: Rc<S>,
    rx: async_channel::Receiver<Job<S>>,
    max_inflight: usize,
) -> Result<()> {
    let permits = Rc::new(glommio::sync::Semaphore::new(max_inflight as u64));
    while let Ok(job) = rx.recv().await {
        // Bound the requests running at once; the channel bound then pushes back on senders.
        let Ok(permit) = permits.acquire_static_permit(1).await else {
            break;
        };
        let fut = job(shard.clone(), state.clone());
        glommio::spawn_local(async move {
            fut.await;
            drop(permit);
        })
        .detach();
    }
    // Closed: wait for in-flight jobs to return their permits, then close the files.
    let _ = permits.acquire(max_inflight as u64).await;
    drop(state);
    match Rc::try_unwrap(shard) {
        Ok(shard) => shard.close().await,
        Err(shard) => shard.sync().await,
    }
}
