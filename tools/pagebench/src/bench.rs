//! The workload driver shared by the `ufs`, `fuse`, `s3`, `client` and `fusecmp` targets: the
//! workloads, the targets they run against, what a run measures, and how it is reported.
//!
//! Workloads (the same operations, in the same order for the same seed, on every target):
//!
//! - `seq`: every flat file read once from start to end in `--block` reads, the files split
//!   over the readers (reader r takes files r, r + readers, ...);
//! - `pages`: random whole pages (`--page-size`, the cluster's page size);
//! - `rand4k`, `rand128k`: random 4 KiB / 128 KiB reads, aligned, inside random pages;
//! - `zipf`: whole pages drawn with Zipf skew `--zipf S` (default 0.99): a hot set;
//! - `episodes`: robot-episode training samples: a few frames, each read from its GOP's key
//!   frame, plus a long window of proprioception/action records (see `dataset.rs`).
//!
//! `--zipf S` also skews the page choice of `pages`, `rand4k`, `rand128k` and the episode
//! choice of `episodes`. Random workloads and `episodes` run `readers x qd` independent
//! streams, one operation at a time each; `seq` runs `readers` scans.

use std::{
    collections::{hash_map, HashMap},
    io::Read,
    os::unix::fs::{FileExt, OpenOptionsExt},
    path::PathBuf,
    sync::{
        atomic::{AtomicI64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};
use bytes::Bytes;
use futures_util::{stream, StreamExt};
use hdrhistogram::Histogram;
use pagestore_client::{
    ufs::{MountTable, ObjectInfo},
    Client,
};
use pagestore_engine::{PageKey, ShardHandle};

use crate::{
    dataset::{self, Dataset, Entry, EpisodeLayout},
    local::{cpu_seconds, new_hist, rng_next},
    zipf::Zipf,
    Opts,
};

/// The workloads, by name.
pub const WORKLOADS: &[&str] = &["seq", "pages", "rand4k", "rand128k", "zipf", "episodes"];

/// Default skew of the `zipf` workload.
pub const DEFAULT_ZIPF: f64 = 0.99;

/// A tokio runtime with `threads` workers.
pub fn runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .context("cannot start a tokio runtime")
}

/// `url` with `--ufs-latency-ms` / `--ufs-mbps` added as the mount table's emulation knobs.
pub fn with_emulation(url: &str, o: &Opts) -> String {
    let mut q = Vec::new();
    if let Some(ms) = o.ufs_latency_ms {
        q.push(format!("emulate_latency_ms={ms}"));
    }
    if let Some(m) = o.ufs_mbps {
        q.push(format!("emulate_mbps={m}"));
    }
    if q.is_empty() {
        return url.to_string();
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{}", q.join("&"))
}

/// One workload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Workload {
    /// Whole-file scans.
    Seq,
    /// Random whole pages.
    Pages,
    /// Random aligned reads of this many bytes.
    Rand(u64),
    /// Zipf-skewed whole pages.
    Zipf,
    /// Robot-episode samples.
    Episodes,
}

impl Workload {
    /// Parses a workload name.
    pub fn parse(s: &str) -> Result<Workload> {
        Ok(match s {
            "seq" => Workload::Seq,
            "pages" => Workload::Pages,
            "rand4k" => Workload::Rand(4096),
            "rand128k" => Workload::Rand(128 << 10),
            "zipf" => Workload::Zipf,
            "episodes" => Workload::Episodes,
            _ => bail!("unknown workload {s:?} (one of {})", WORKLOADS.join(", ")),
        })
    }

    /// Its name.
    pub fn name(self) -> String {
        match self {
            Workload::Seq => "seq".into(),
            Workload::Pages => "pages".into(),
            Workload::Rand(b) => format!("rand{}k", b >> 10),
            Workload::Zipf => "zipf".into(),
            Workload::Episodes => "episodes".into(),
        }
    }
}

/// What one run does.
#[derive(Clone, Debug)]
pub struct Spec {
    /// The workload.
    pub workload: Workload,
    /// Readers.
    pub readers: usize,
    /// Operations in flight per reader (random workloads: independent streams; `seq` through
    /// ufs, s3 and the engine: blocks in flight per scan).
    pub qd: usize,
    /// `seq`: bytes per read.
    pub block: u64,
    /// Page size (the unit of `pages` and `zipf`, and of random block placement).
    pub page: u64,
    /// Time limit.
    pub seconds: f64,
    /// Byte limit over all readers.
    pub bytes: Option<u64>,
    /// Seed of the operation streams.
    pub seed: u64,
    /// Skew (None: uniform).
    pub zipf: Option<f64>,
    /// `episodes`: frames per sample.
    pub frames: u32,
    /// `episodes`: seconds of proprioception per sample.
    pub window: f64,
    /// Check every Nth operation of each stream against the generator (0: none).
    pub verify_every: u64,
}

impl Spec {
    /// The run `o` asks for, of `workload` with `readers` readers.
    pub fn from_opts(o: &Opts, workload: Workload, readers: usize, page: u64) -> Spec {
        Spec {
            workload,
            readers,
            qd: o.reader_qd(),
            block: o.block,
            page,
            seconds: o.seconds,
            bytes: o.bytes,
            seed: o.seed,
            zipf: o.zipf,
            frames: o.sample_frames,
            window: o.window_secs,
            verify_every: o.verify_every,
        }
    }

    fn streams(&self) -> usize {
        match self.workload {
            Workload::Seq => self.readers.max(1),
            _ => self.readers.max(1) * self.qd.max(1),
        }
    }

    fn skew(&self) -> Option<f64> {
        match self.workload {
            Workload::Zipf => Some(self.zipf.unwrap_or(DEFAULT_ZIPF)),
            _ => self.zipf,
        }
    }
}

/// The dataset as the workloads see it: flat files first, then episodes.
pub struct Catalog {
    /// The descriptor.
    pub ds: Dataset,
    /// Flat files, then episode files.
    pub files: Vec<Entry>,
    /// How many of `files` are flat.
    pub flat: usize,
    /// Layouts of the episode files (`files[flat + i]`).
    pub layouts: Vec<EpisodeLayout>,
}

impl Catalog {
    /// The catalog of `ds`.
    pub fn new(ds: Dataset) -> Catalog {
        let mut files = ds.flat();
        let flat = files.len();
        let mut layouts = Vec::new();
        for (e, l) in ds.episodes() {
            files.push(e);
            layouts.push(l);
        }
        Catalog {
            ds,
            files,
            flat,
            layouts,
        }
    }

    /// Bytes of the flat files.
    pub fn flat_bytes(&self) -> u64 {
        self.files[..self.flat].iter().map(|e| e.size).sum()
    }

    /// Bytes of every file.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|e| e.size).sum()
    }
}

/// Chooses the operations of one run.
struct Picker {
    cat: Arc<Catalog>,
    page: u64,
    pages_per_file: u64,
    pages: u64,
    zipf: Option<Zipf>,
}

impl Picker {
    fn new(cat: Arc<Catalog>, spec: &Spec) -> Result<Picker> {
        let page = spec.page.max(4096);
        let file_size = cat.ds.file_size;
        let pages_per_file = file_size.div_ceil(page).max(1);
        let pages = pages_per_file * cat.flat as u64;
        let items = match spec.workload {
            Workload::Episodes => cat.layouts.len() as u64,
            Workload::Seq => 0,
            _ => pages,
        };
        match spec.workload {
            Workload::Episodes if cat.layouts.is_empty() => {
                bail!("the dataset has no episodes (gen --episodes N)")
            }
            Workload::Seq | Workload::Pages | Workload::Rand(_) | Workload::Zipf
                if cat.flat == 0 =>
            {
                bail!("the dataset has no flat files (gen --size, --file-size)")
            }
            _ => {}
        }
        let zipf = match spec.skew() {
            Some(s) if items > 0 => Some(Zipf::new(items, s, spec.seed)?),
            _ => None,
        };
        Ok(Picker {
            cat,
            page,
            pages_per_file,
            pages,
            zipf,
        })
    }

    fn item(&self, x: &mut u64, n: u64) -> u64 {
        match &self.zipf {
            Some(z) => z.sample(x),
            None => rng_next(x) % n.max(1),
        }
    }

    /// A random read: (file, offset, length).
    fn read(&self, x: &mut u64, workload: Workload) -> (usize, u64, u64) {
        let g = self.item(x, self.pages);
        let file = (g / self.pages_per_file) as usize;
        let p = g % self.pages_per_file;
        let size = self.cat.files[file].size;
        let start = p * self.page;
        let page_len = self.page.min(size.saturating_sub(start));
        match workload {
            Workload::Rand(block) if page_len > block => {
                let slot = rng_next(x) % (page_len / block);
                (file, start + slot * block, block)
            }
            _ => (file, start, page_len),
        }
    }

    /// One episode sample: (file, ranges).
    fn sample(&self, x: &mut u64, spec: &Spec) -> (usize, Vec<(u64, u64)>) {
        let e = self.item(x, self.cat.layouts.len() as u64) as usize;
        let ranges = self.cat.layouts[e].sample(&self.cat.ds.episodes, spec.frames, spec.window, x);
        (self.cat.flat + e, ranges)
    }

    fn pages_touched(&self, ranges: &[(u64, u64)]) -> u64 {
        let mut pages: Vec<u64> = ranges
            .iter()
            .filter(|r| r.1 > 0)
            .flat_map(|&(off, len)| (off / self.page)..=((off + len - 1) / self.page))
            .collect();
        pages.sort_unstable();
        pages.dedup();
        pages.len() as u64
    }
}

/// When a run ends: a deadline, and optionally a byte budget over all readers.
struct Stop {
    deadline: Instant,
    left: Option<AtomicI64>,
}

impl Stop {
    fn new(spec: &Spec) -> Stop {
        Stop {
            deadline: Instant::now() + Duration::from_secs_f64(spec.seconds.max(0.0)),
            left: spec.bytes.map(|b| AtomicI64::new(b as i64)),
        }
    }

    fn take(&self, n: u64) -> bool {
        if Instant::now() >= self.deadline {
            return false;
        }
        match &self.left {
            Some(l) => l.fetch_sub(n as i64, Ordering::Relaxed) > 0,
            None => true,
        }
    }
}

/// What one stream measured.
struct Tally {
    ops: u64,
    bytes: u64,
    verified_ops: u64,
    verified_bytes: u64,
    ranges: u64,
    pages_touched: u64,
    hist: Histogram<u64>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            ops: 0,
            bytes: 0,
            verified_ops: 0,
            verified_bytes: 0,
            ranges: 0,
            pages_touched: 0,
            hist: new_hist(),
        }
    }

    fn add(&mut self, o: &Tally) -> Result<()> {
        self.ops += o.ops;
        self.bytes += o.bytes;
        self.verified_ops += o.verified_ops;
        self.verified_bytes += o.verified_bytes;
        self.ranges += o.ranges;
        self.pages_touched += o.pages_touched;
        self.hist.add(&o.hist)?;
        Ok(())
    }

    fn record(&mut self, took: Duration, bytes: u64) {
        self.hist.saturating_record(took.as_nanos() as u64);
        self.ops += 1;
        self.bytes += bytes;
    }

    /// Whether the next operation's bytes are checked: every `every`-th (the first included).
    fn due(&self, every: u64) -> bool {
        every > 0 && self.ops % every == 0
    }

    /// Checks the length of `buf`, and with `check` its bytes against the generator.
    fn verify(
        &mut self,
        check: bool,
        target: &str,
        e: &Entry,
        off: u64,
        want: u64,
        buf: &[u8],
    ) -> Result<()> {
        if buf.len() as u64 != want {
            bail!(
                "{target}: {} at {off}: {} bytes where {want} were expected",
                e.rel,
                buf.len()
            );
        }
        if !check {
            return Ok(());
        }
        dataset::check(e.key, off, buf).map_err(|bad| {
            anyhow!(
                "{target}: {} bytes {off}..{}: wrong byte at offset {bad} (not what gen wrote)",
                e.rel,
                off + want
            )
        })?;
        self.verified_ops += 1;
        self.verified_bytes += want;
        Ok(())
    }
}

/// A target read through the operating system's file interface: a directory of the dataset
/// (a pagefs mount, or any local or network file system).
#[derive(Clone, Debug)]
pub struct FsTarget {
    /// The dataset root.
    pub root: PathBuf,
    /// Open with O_DIRECT (bypass the kernel's page cache; buffers and offsets aligned).
    pub direct: bool,
    /// Drop the files' cached pages (POSIX_FADV_DONTNEED) before each run.
    pub drop_cache: bool,
}

const ALIGN: usize = 4096;

/// A heap buffer aligned for O_DIRECT.
struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain owned memory, used by one thread at a time.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let len = len.max(ALIGN).next_multiple_of(ALIGN);
        let layout = std::alloc::Layout::from_size_align(len, ALIGN).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr points to len initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, ALIGN).expect("valid layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

fn fadvise(f: &std::fs::File, advice: libc::c_int) {
    use std::os::fd::AsRawFd;
    // SAFETY: fadvise on an open descriptor; no memory is involved.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, advice) };
}

impl FsTarget {
    fn path(&self, e: &Entry) -> PathBuf {
        self.root.join(&e.rel)
    }

    fn open(&self, e: &Entry, advice: libc::c_int) -> Result<std::fs::File> {
        let mut oo = std::fs::OpenOptions::new();
        oo.read(true);
        if self.direct {
            oo.custom_flags(libc::O_DIRECT);
        }
        let f = oo
            .open(self.path(e))
            .with_context(|| self.path(e).display().to_string())?;
        fadvise(&f, advice);
        Ok(f)
    }

    /// Checks that every file is there with its size.
    pub fn check(&self, cat: &Catalog) -> Result<()> {
        for e in &cat.files {
            let m = std::fs::metadata(self.path(e))
                .with_context(|| self.path(e).display().to_string())?;
            if m.len() != e.size {
                bail!(
                    "{}: {} bytes, the descriptor says {}; run gen again",
                    self.path(e).display(),
                    m.len(),
                    e.size
                );
            }
        }
        Ok(())
    }

    fn drop_caches(&self, cat: &Catalog) {
        if !self.drop_cache {
            return;
        }
        for e in &cat.files {
            if let Ok(f) = std::fs::File::open(self.path(e)) {
                fadvise(&f, libc::POSIX_FADV_DONTNEED);
            }
        }
    }

    /// `len` bytes at `off` into `buf` (aligned outward for O_DIRECT): the bytes read.
    fn pread<'a>(
        &self,
        f: &std::fs::File,
        off: u64,
        len: u64,
        buf: &'a mut AlignedBuf,
    ) -> Result<&'a [u8]> {
        let (start, skip) = if self.direct {
            let s = off / ALIGN as u64 * ALIGN as u64;
            (s, (off - s) as usize)
        } else {
            (off, 0)
        };
        let want = skip + len as usize;
        let span = if self.direct {
            want.next_multiple_of(ALIGN)
        } else {
            want
        };
        if buf.len < span {
            *buf = AlignedBuf::new(span);
        }
        let b = buf.as_mut();
        let mut got = 0;
        while got < want {
            match f.read_at(&mut b[got..span], start + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(
                        anyhow::Error::new(e).context(format!("read at {}", start + got as u64))
                    )
                }
            }
        }
        let end = got.min(want);
        Ok(&b[skip.min(end)..end])
    }
}

/// A target with an async read: the under storage (object_store: a local directory or an S3
/// endpoint such as pages3), the client library, or the engine in this process.
pub enum AsyncTarget {
    /// object_store through the mount table; `infos[i]` is `Catalog::files[i]`.
    Store {
        /// The table.
        table: Arc<MountTable>,
        /// Every file, stat'ed.
        infos: Vec<ObjectInfo>,
    },
    /// The client library.
    Client {
        /// The client.
        client: Arc<Client>,
        /// Every file, stat'ed.
        infos: Vec<ObjectInfo>,
    },
    /// The engine, pages filled from the dataset.
    Engine {
        /// Its shards.
        shards: Vec<ShardHandle>,
        /// `[file][page]`: the shard holding it.
        owner: Vec<Vec<u8>>,
        /// Page size.
        page: u64,
    },
}

/// Stats every file of `cat` under `prefix` through `stat`.
pub async fn stat_all<F, Fut>(cat: &Catalog, prefix: &str, stat: F) -> Result<Vec<ObjectInfo>>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<ObjectInfo>>,
{
    let got: Vec<Result<ObjectInfo>> = stream::iter(cat.files.iter())
        .map(|e| stat(format!("{prefix}/{}", e.rel)))
        .buffered(32)
        .collect()
        .await;
    let mut out = Vec::with_capacity(got.len());
    for (r, e) in got.into_iter().zip(&cat.files) {
        let info = r?;
        if info.size != e.size {
            bail!(
                "{}: {} bytes, the descriptor says {}; run gen again",
                info.path,
                info.size,
                e.size
            );
        }
        out.push(info);
    }
    Ok(out)
}

impl AsyncTarget {
    /// Reads `len` bytes at `off` of `cat.files[f]`.
    pub async fn read(&self, cat: &Catalog, f: usize, off: u64, len: u64) -> Result<Bytes> {
        match self {
            AsyncTarget::Store { table, infos } => {
                Ok(table.read(&infos[f], off..off + len).await?)
            }
            AsyncTarget::Client { client, infos } => {
                Ok(client.read_at(&infos[f], off, len).await?)
            }
            AsyncTarget::Engine {
                shards,
                owner,
                page,
            } => {
                let e = &cat.files[f];
                let end = (off + len).min(e.size);
                let mut out = Vec::with_capacity(end.saturating_sub(off) as usize);
                let mut pos = off;
                while pos < end {
                    let p = pos / page;
                    let in_page = pos - p * page;
                    let n = (page - in_page).min(end - pos);
                    let key = PageKey::new(u128::from(e.key), p);
                    let got = shards[owner[f][p as usize] as usize]
                        .get(key, in_page as u32, n as u32)
                        .await?
                        .ok_or_else(|| anyhow!("{} page {p} is not in the engine", e.rel))?;
                    out.extend_from_slice(&got);
                    pos += n;
                }
                Ok(Bytes::from(out))
            }
        }
    }

    /// Fills a fresh engine with every page of the catalog's files, read from `root`.
    pub fn fill_engine(
        engine: &pagestore_engine::Engine,
        cat: &Catalog,
        root: &std::path::Path,
        rt: &tokio::runtime::Runtime,
    ) -> Result<AsyncTarget> {
        let page = u64::from(engine.page_size());
        let mut owner = Vec::new();
        let mut work = Vec::new();
        for (i, e) in cat.files.iter().enumerate() {
            let pages = e.size.div_ceil(page);
            let mut o = Vec::with_capacity(pages as usize);
            for p in 0..pages {
                let key = PageKey::new(u128::from(e.key), p);
                o.push(engine.shard_of(&key).id() as u8);
                work.push((i, p));
            }
            owner.push(o);
        }
        let shards = engine.shards().to_vec();
        rt.block_on(async {
            let results: Vec<Result<()>> = stream::iter(work)
                .map(|(i, p)| {
                    let e = &cat.files[i];
                    let path = root.join(&e.rel);
                    let shard = shards[owner[i][p as usize] as usize].clone();
                    async move {
                        let start = p * page;
                        let len = page.min(e.size - start);
                        let data = tokio::task::spawn_blocking(move || {
                            let f = std::fs::File::open(&path)
                                .with_context(|| path.display().to_string())?;
                            let mut v = vec![0u8; len as usize];
                            f.read_exact_at(&mut v, start)
                                .with_context(|| path.display().to_string())?;
                            Ok::<_, anyhow::Error>(v)
                        })
                        .await??;
                        shard
                            .put(PageKey::new(u128::from(e.key), p), data, 1)
                            .await
                            .context("engine put")?;
                        Ok(())
                    }
                })
                .buffer_unordered(8)
                .collect()
                .await;
            results.into_iter().collect::<Result<()>>()
        })?;
        Ok(AsyncTarget::Engine {
            shards,
            owner,
            page,
        })
    }
}

/// A target of a run.
#[derive(Clone)]
pub enum Target {
    /// Files through the OS.
    Fs(Arc<FsTarget>),
    /// Async reads.
    Async(Arc<AsyncTarget>),
}

/// Processes whose CPU time a run reports, and where the cluster's hit counters come from.
#[derive(Clone, Default)]
pub struct Probe {
    /// A client of the cluster behind the target: hits and misses from every shard's counters.
    pub counters: Option<Arc<Client>>,
    /// The cluster's node processes.
    pub nodes: Vec<u32>,
    /// The front-end process (pagefs, pages3) and any `--cpu-pids`.
    pub frontend: Vec<u32>,
}

/// CPU seconds (user + system) used so far by process `pid` (0 if it cannot be read).
pub fn proc_cpu(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    // utime and stime are fields 14 and 15 (1-based), i.e. 11 and 12 after the name.
    (ticks(11) + ticks(12)) / hz
}

struct Snap {
    bench: f64,
    nodes: f64,
    frontend: f64,
    hits: Option<(u64, u64)>,
}

/// `(hits, misses)` summed over every shard that answers; hits served by a shard's memory tier
/// count as hits (its engine, which they never reach, counts only the others).
pub async fn cluster_hits(client: &Client) -> Option<(u64, u64)> {
    let stats = client.shard_counters().await;
    let mut any = false;
    let mut t = (0, 0);
    for (_, _, c) in stats {
        if let Some(c) = c {
            any = true;
            t.0 += c.hits + c.memory_hits;
            t.1 += c.misses;
        }
    }
    any.then_some(t)
}

/// What a [`Probe`] saw over one piece of work.
pub struct Probed {
    /// Wall seconds.
    pub secs: f64,
    /// CPU seconds of this process.
    pub cpu_bench: f64,
    /// CPU seconds of the front-end process(es), if the probe has any.
    pub cpu_frontend: Option<f64>,
    /// CPU seconds of the node processes, if the probe has any.
    pub cpu_nodes: Option<f64>,
    /// Cluster hits and misses, if the probe has counters.
    pub hits: Option<(u64, u64)>,
}

impl Probe {
    fn snap(&self, rt: &tokio::runtime::Runtime) -> Snap {
        Snap {
            bench: cpu_seconds(),
            nodes: self.nodes.iter().map(|p| proc_cpu(*p)).sum(),
            frontend: self.frontend.iter().map(|p| proc_cpu(*p)).sum(),
            hits: self
                .counters
                .as_ref()
                .and_then(|c| rt.block_on(cluster_hits(c))),
        }
    }

    /// Runs `work` (outside `rt`) between two snapshots: its time, the CPU it took here, in
    /// the front end and in the nodes, and the hits and misses the cluster counted meanwhile.
    pub fn measure<T>(
        &self,
        rt: &tokio::runtime::Runtime,
        work: impl FnOnce() -> Result<T>,
    ) -> Result<(T, Probed)> {
        let before = self.snap(rt);
        let start = Instant::now();
        let out = work()?;
        let secs = start.elapsed().as_secs_f64();
        let after = self.snap(rt);
        let hits = match (before.hits, after.hits) {
            (Some(a), Some(b)) => Some((b.0.saturating_sub(a.0), b.1.saturating_sub(a.1))),
            _ => None,
        };
        Ok((
            out,
            Probed {
                secs,
                cpu_bench: after.bench - before.bench,
                cpu_frontend: (!self.frontend.is_empty())
                    .then_some(after.frontend - before.frontend),
                cpu_nodes: (!self.nodes.is_empty()).then_some(after.nodes - before.nodes),
                hits,
            },
        ))
    }
}

/// What one run measured.
pub struct RunResult {
    /// Target label.
    pub target: String,
    /// Workload name.
    pub workload: String,
    /// Readers.
    pub readers: usize,
    /// Operations in flight per reader.
    pub qd: usize,
    /// Bytes per operation (`seq`: per read call; episodes: 0, it varies).
    pub block: u64,
    /// Operations (episodes: samples).
    pub ops: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Wall seconds.
    pub secs: f64,
    /// Latency per operation, nanoseconds.
    pub hist: Histogram<u64>,
    /// CPU seconds of this process.
    pub cpu_bench: f64,
    /// CPU seconds of the front-end process(es), if any.
    pub cpu_frontend: Option<f64>,
    /// CPU seconds of the node processes, if any.
    pub cpu_nodes: Option<f64>,
    /// Cluster hits and misses during the run, if known.
    pub hits: Option<(u64, u64)>,
    /// Operations checked against the generator, and their bytes.
    pub verified_ops: u64,
    /// See `verified_ops`.
    pub verified_bytes: u64,
    /// Episodes: ranges read and pages touched, over all samples.
    pub ranges: u64,
    /// See `ranges`.
    pub pages_touched: u64,
}

impl RunResult {
    /// Bytes per second.
    pub fn bw(&self) -> f64 {
        self.bytes as f64 / self.secs.max(1e-9)
    }

    /// Operations per second.
    pub fn iops(&self) -> f64 {
        self.ops as f64 / self.secs.max(1e-9)
    }

    /// Latency quantile in microseconds.
    pub fn us(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64 / 1e3
    }

    /// Hit ratio during the run.
    pub fn hit_ratio(&self) -> Option<f64> {
        self.hits
            .filter(|(h, m)| h + m > 0)
            .map(|(h, m)| h as f64 / (h + m) as f64)
    }

    /// CPU seconds per GB read (bench, front-end, nodes).
    pub fn cpu_per_gb(&self) -> (f64, Option<f64>, Option<f64>) {
        let gb = (self.bytes as f64 / 1e9).max(1e-12);
        (
            self.cpu_bench / gb,
            self.cpu_frontend.map(|c| c / gb),
            self.cpu_nodes.map(|c| c / gb),
        )
    }

    /// JSON form.
    pub fn to_json(&self) -> serde_json::Value {
        let (b, f, n) = self.cpu_per_gb();
        let mut v = serde_json::json!({
            "target": self.target, "workload": self.workload, "readers": self.readers,
            "qd": self.qd, "block": self.block, "ops": self.ops, "bytes": self.bytes,
            "seconds": self.secs, "bytes_per_sec": self.bw(), "iops": self.iops(),
            "latency_us": {
                "p50": self.us(0.5), "p90": self.us(0.9), "p99": self.us(0.99),
                "p99.9": self.us(0.999), "max": self.hist.max() as f64 / 1e3,
            },
            "cpu_seconds_per_gb": {"bench": b, "frontend": f, "nodes": n},
            "hits": self.hits.map(|h| h.0), "misses": self.hits.map(|h| h.1),
            "hit_ratio": self.hit_ratio(),
            "verified_ops": self.verified_ops, "verified_bytes": self.verified_bytes,
        });
        if self.workload == "episodes" && self.ops > 0 {
            v["ranges_per_sample"] = (self.ranges as f64 / self.ops as f64).into();
            v["pages_per_sample"] = (self.pages_touched as f64 / self.ops as f64).into();
        }
        v
    }
}

/// Runs one workload on one target.
pub fn run(
    label: &str,
    target: &Target,
    cat: &Arc<Catalog>,
    spec: &Spec,
    probe: &Probe,
    rt: &tokio::runtime::Runtime,
) -> Result<RunResult> {
    let picker = Arc::new(Picker::new(cat.clone(), spec)?);
    if let Target::Fs(fs) = target {
        fs.drop_caches(cat);
    }
    let (tally, m) = probe.measure(rt, || match target {
        Target::Fs(fs) => run_fs(label, fs, &picker, spec),
        Target::Async(t) => rt.block_on(run_async(label, t.clone(), picker.clone(), spec)),
    })?;
    let block = match spec.workload {
        Workload::Seq => spec.block,
        Workload::Pages | Workload::Zipf => picker.page,
        Workload::Rand(b) => b,
        Workload::Episodes => 0,
    };
    if tally.ops == 0 {
        bail!(
            "{label} {}: no operation completed (is --seconds too short?)",
            spec.workload.name()
        );
    }
    Ok(RunResult {
        target: label.to_string(),
        workload: spec.workload.name(),
        readers: spec.readers,
        qd: spec.qd,
        block,
        ops: tally.ops,
        bytes: tally.bytes,
        secs: m.secs,
        hist: tally.hist,
        cpu_bench: m.cpu_bench,
        cpu_frontend: m.cpu_frontend,
        cpu_nodes: m.cpu_nodes,
        hits: m.hits,
        verified_ops: tally.verified_ops,
        verified_bytes: tally.verified_bytes,
        ranges: tally.ranges,
        pages_touched: tally.pages_touched,
    })
}

fn seq_files(cat: &Catalog, reader: usize, readers: usize) -> Vec<usize> {
    (0..cat.flat).filter(|f| f % readers == reader).collect()
}

fn run_fs(label: &str, fs: &FsTarget, picker: &Picker, spec: &Spec) -> Result<Tally> {
    let stop = Stop::new(spec);
    let streams = spec.streams();
    let results: Vec<Result<Tally>> = std::thread::scope(|s| {
        let joins: Vec<_> = (0..streams)
            .map(|w| {
                let stop = &stop;
                s.spawn(move || fs_stream(label, fs, picker, spec, stop, w))
            })
            .collect();
        joins
            .into_iter()
            .map(|j| {
                j.join()
                    .unwrap_or_else(|_| Err(anyhow!("reader thread panicked")))
            })
            .collect()
    });
    let mut t = Tally::new();
    for r in results {
        t.add(&r?)?;
    }
    Ok(t)
}

/// What every read stream of a run shares.
#[derive(Clone, Copy)]
struct Stream<'a> {
    label: &'a str,
    picker: &'a Picker,
    spec: &'a Spec,
    stop: &'a Stop,
}

fn fs_stream(
    label: &str,
    fs: &FsTarget,
    picker: &Picker,
    spec: &Spec,
    stop: &Stop,
    w: usize,
) -> Result<Tally> {
    let s = Stream {
        label,
        picker,
        spec,
        stop,
    };
    let mut t = Tally::new();
    let mut x = dataset::rng_state(spec.seed, w as u64 + 1);
    let mut buf = AlignedBuf::new(spec.block.max(picker.page) as usize);
    match spec.workload {
        Workload::Seq => fs_seq(s, fs, w, &mut t, &mut buf)?,
        Workload::Episodes => fs_episodes(s, fs, &mut x, &mut t, &mut buf)?,
        wl => fs_random(s, fs, wl, &mut x, &mut t, &mut buf)?,
    }
    Ok(t)
}

/// The stream's share of the files, each read from start to end in `spec.block` reads.
fn fs_seq(s: Stream, fs: &FsTarget, w: usize, t: &mut Tally, buf: &mut AlignedBuf) -> Result<()> {
    let Stream {
        label,
        picker,
        spec,
        stop,
    } = s;
    let cat = &picker.cat;
    for f in seq_files(cat, w, spec.readers.max(1)) {
        let e = &cat.files[f];
        let mut file = fs.open(e, libc::POSIX_FADV_SEQUENTIAL)?;
        let mut off = 0u64;
        while off < e.size {
            let want = spec.block.min(e.size - off);
            if !stop.take(want) {
                return Ok(());
            }
            let t0 = Instant::now();
            let b = buf.as_mut();
            let span = if fs.direct {
                (want as usize).next_multiple_of(ALIGN)
            } else {
                want as usize
            };
            let mut got = 0usize;
            while got < want as usize {
                match file.read(&mut b[got..span]) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(err) => {
                        return Err(
                            anyhow::Error::new(err).context(fs.path(e).display().to_string())
                        );
                    }
                }
            }
            let took = t0.elapsed();
            t.verify(
                t.due(spec.verify_every),
                label,
                e,
                off,
                want,
                &b[..got.min(span)],
            )?;
            t.record(took, want);
            off += want;
        }
    }
    Ok(())
}

/// Sampled episodes: each a set of ranges of one file, timed together.
fn fs_episodes(
    s: Stream,
    fs: &FsTarget,
    x: &mut u64,
    t: &mut Tally,
    buf: &mut AlignedBuf,
) -> Result<()> {
    let Stream {
        label,
        picker,
        spec,
        stop,
    } = s;
    let cat = &picker.cat;
    let mut open: HashMap<usize, std::fs::File> = HashMap::new();
    loop {
        let (f, ranges) = picker.sample(x, spec);
        let total: u64 = ranges.iter().map(|r| r.1).sum();
        if !stop.take(total) {
            return Ok(());
        }
        let e = &cat.files[f];
        let file = match open.entry(f) {
            hash_map::Entry::Occupied(o) => o.into_mut(),
            hash_map::Entry::Vacant(v) => v.insert(fs.open(e, libc::POSIX_FADV_RANDOM)?),
        };
        let check = t.due(spec.verify_every);
        let t0 = Instant::now();
        let mut copies = Vec::new();
        for &(off, len) in &ranges {
            let got = fs
                .pread(file, off, len, buf)
                .with_context(|| fs.path(e).display().to_string())?;
            if got.len() as u64 != len {
                bail!(
                    "{label}: {} at {off}: {} bytes where {len} were expected",
                    e.rel,
                    got.len()
                );
            }
            if check {
                copies.push((off, len, got.to_vec()));
            }
        }
        let took = t0.elapsed();
        for (off, len, got) in copies {
            t.verify(true, label, e, off, len, &got)?;
        }
        t.record(took, total);
        t.ranges += ranges.len() as u64;
        t.pages_touched += picker.pages_touched(&ranges);
    }
}

/// Random reads of `wl`'s size, each timed on its own.
fn fs_random(
    s: Stream,
    fs: &FsTarget,
    wl: Workload,
    x: &mut u64,
    t: &mut Tally,
    buf: &mut AlignedBuf,
) -> Result<()> {
    let Stream {
        label,
        picker,
        spec,
        stop,
    } = s;
    let cat = &picker.cat;
    let mut open: HashMap<usize, std::fs::File> = HashMap::new();
    loop {
        let (f, off, len) = picker.read(x, wl);
        if !stop.take(len) {
            return Ok(());
        }
        let e = &cat.files[f];
        let file = match open.entry(f) {
            hash_map::Entry::Occupied(o) => o.into_mut(),
            hash_map::Entry::Vacant(v) => v.insert(fs.open(e, libc::POSIX_FADV_RANDOM)?),
        };
        let t0 = Instant::now();
        let got = fs
            .pread(file, off, len, buf)
            .with_context(|| fs.path(e).display().to_string())?;
        let took = t0.elapsed();
        t.verify(t.due(spec.verify_every), label, e, off, len, got)?;
        t.record(took, len);
    }
}

async fn run_async(
    label: &str,
    target: Arc<AsyncTarget>,
    picker: Arc<Picker>,
    spec: &Spec,
) -> Result<Tally> {
    let stop = Arc::new(Stop::new(spec));
    let mut tasks = Vec::new();
    for w in 0..spec.streams() {
        let (target, picker, stop, spec) =
            (target.clone(), picker.clone(), stop.clone(), spec.clone());
        let label = label.to_string();
        tasks.push(tokio::spawn(async move {
            async_stream(&label, &target, &picker, &spec, &stop, w).await
        }));
    }
    let mut t = Tally::new();
    for task in tasks {
        t.add(&task.await??)?;
    }
    Ok(t)
}

async fn async_stream(
    label: &str,
    target: &AsyncTarget,
    picker: &Picker,
    spec: &Spec,
    stop: &Stop,
    w: usize,
) -> Result<Tally> {
    let s = Stream {
        label,
        picker,
        spec,
        stop,
    };
    let mut t = Tally::new();
    let mut x = dataset::rng_state(spec.seed, w as u64 + 1);
    match spec.workload {
        Workload::Seq => async_seq(s, target, w, &mut t).await?,
        Workload::Episodes => async_episodes(s, target, &mut x, &mut t).await?,
        wl => async_random(s, target, wl, &mut x, &mut t).await?,
    }
    Ok(t)
}

/// The stream's share of the files, each read from start to end: through a file handle for
/// the client, else with `spec.qd` blocks in flight, in order.
async fn async_seq(s: Stream<'_>, target: &AsyncTarget, w: usize, t: &mut Tally) -> Result<()> {
    let Stream {
        label,
        picker,
        spec,
        stop,
    } = s;
    let cat = &picker.cat;
    for f in seq_files(cat, w, spec.readers.max(1)) {
        let e = &cat.files[f];
        if let AsyncTarget::Client { client, infos } = target {
            // A file handle: the client's own read-ahead keeps pages in flight.
            use tokio::io::AsyncReadExt;
            let mut h = client.open(&infos[f].path).await?;
            let mut buf = vec![0u8; spec.block as usize];
            let mut off = 0u64;
            while off < e.size {
                let want = spec.block.min(e.size - off);
                if !stop.take(want) {
                    return Ok(());
                }
                let t0 = Instant::now();
                let mut got = 0usize;
                while got < want as usize {
                    let n = h
                        .read(&mut buf[got..want as usize])
                        .await
                        .with_context(|| infos[f].path.clone())?;
                    if n == 0 {
                        break;
                    }
                    got += n;
                }
                let took = t0.elapsed();
                t.verify(t.due(spec.verify_every), label, e, off, want, &buf[..got])?;
                t.record(took, want);
                off += want;
            }
            continue;
        }
        // Blocks in flight, in order.
        let blocks = (0..e.size.div_ceil(spec.block)).map(|i| {
            let off = i * spec.block;
            (off, spec.block.min(e.size - off))
        });
        let mut s = std::pin::pin!(stream::iter(blocks)
            .take_while(|&(_, len)| std::future::ready(stop.take(len)))
            .map(|(off, len)| async move {
                let t0 = Instant::now();
                let r = target.read(cat, f, off, len).await;
                (off, len, t0.elapsed(), r)
            })
            .buffered(spec.qd.max(1)));
        while let Some((off, len, took, r)) = s.next().await {
            let b = r?;
            t.verify(t.due(spec.verify_every), label, e, off, len, &b)?;
            t.record(took, len);
        }
        if Instant::now() >= stop.deadline {
            return Ok(());
        }
    }
    Ok(())
}

/// Sampled episodes: each a set of ranges of one file, timed together.
async fn async_episodes(
    s: Stream<'_>,
    target: &AsyncTarget,
    x: &mut u64,
    t: &mut Tally,
) -> Result<()> {
    let Stream {
        label,
        picker,
        spec,
        stop,
    } = s;
    let cat = &picker.cat;
    loop {
        let (f, ranges) = picker.sample(x, spec);
        let total: u64 = ranges.iter().map(|r| r.1).sum();
        if !stop.take(total) {
            return Ok(());
        }
        let e = &cat.files[f];
        let check = t.due(spec.verify_every);
        let t0 = Instant::now();
        let mut got = Vec::with_capacity(ranges.len());
        for &(off, len) in &ranges {
            got.push(target.read(cat, f, off, len).await?);
        }
        let took = t0.elapsed();
        for (&(off, len), b) in ranges.iter().zip(&got) {
            t.verify(check, label, e, off, len, b)?;
        }
        t.record(took, total);
        t.ranges += ranges.len() as u64;
        t.pages_touched += picker.pages_touched(&ranges);
    }
}

/// Random reads of `wl`'s size, each timed on its own.
async fn async_random(
    s: Stream<'_>,
    target: &AsyncTarget,
    wl: Workload,
    x: &mut u64,
    t: &mut Tally,
) -> Result<()> {
    let Stream {
        label,
        picker,
        spec,
        stop,
    } = s;
    let cat = &picker.cat;
    loop {
        let (f, off, len) = picker.read(x, wl);
        if !stop.take(len) {
            return Ok(());
        }
        let t0 = Instant::now();
        let b = target.read(cat, f, off, len).await?;
        let took = t0.elapsed();
        t.verify(t.due(spec.verify_every), label, &cat.files[f], off, len, &b)?;
        t.record(took, len);
    }
}

fn opt2(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

/// Prints runs as a table.
pub fn print_table(results: &[RunResult]) {
    println!(
        "{:<7} {:<9} {:>3} {:>3} {:>9} {:>8} {:>7} {:>7} {:>7} {:>8} {:>8} {:>6} {:>6} {:>6} {:>6}",
        "target",
        "workload",
        "rd",
        "qd",
        "MB/s",
        "IOPS",
        "p50 us",
        "p90 us",
        "p99 us",
        "p99.9 us",
        "max us",
        "CPU:b",
        "fe",
        "nodes",
        "hits"
    );
    for r in results {
        let (b, fe, nd) = r.cpu_per_gb();
        println!(
            "{:<7} {:<9} {:>3} {:>3} {:>9.1} {:>8.0} {:>7.0} {:>7.0} {:>7.0} {:>8.0} {:>8.0} {:>6.2} {:>6} {:>6} {:>6}",
            r.target,
            r.workload,
            r.readers,
            r.qd,
            r.bw() / 1e6,
            r.iops(),
            r.us(0.5),
            r.us(0.9),
            r.us(0.99),
            r.us(0.999),
            r.hist.max() as f64 / 1e3,
            b,
            opt2(fe),
            opt2(nd),
            r.hit_ratio()
                .map_or("-".into(), |h| format!("{:.1}%", h * 100.0)),
        );
    }
    for r in results.iter().filter(|r| r.workload == "episodes") {
        println!(
            "{} episodes: {:.1} ranges and {:.1} pages per sample, {:.0} KiB per sample",
            r.target,
            r.ranges as f64 / r.ops as f64,
            r.pages_touched as f64 / r.ops as f64,
            r.bytes as f64 / r.ops as f64 / 1024.0
        );
    }
    let (ops, bytes) = results.iter().fold((0, 0), |a, r| {
        (a.0 + r.verified_ops, a.1 + r.verified_bytes)
    });
    println!(
        "checked against the generator: {ops} operations, {:.1} MB, all byte-exact",
        bytes as f64 / 1e6
    );
}
