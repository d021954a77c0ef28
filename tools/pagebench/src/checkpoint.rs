//! `pagebench checkpoint` (issue 17): a checkpoint of `--size` bytes from `--writers` writers,
//! each one file of `size / writers` written front to back in 4 MiB writes and then closed (as
//! `torch.save` writes), through the cluster's write-back path, against references measured in
//! the same run:
//!
//! - **the store, straight**: the same files written to the emulated distant store through the
//!   mount table (object_store; one put per file up to [`PART`], else a multipart write of
//!   [`PART`] parts, as the cluster's flusher writes), with one part in flight per writer (a
//!   sequential writer, as a file object over the store uploads) and with [`PARTS_IN_FLIGHT`]
//!   per writer (the flusher's). The second one is the store's write bandwidth the flush is
//!   compared with: the same requests, as many in flight.
//! - **the store, un-throttled**: the same writes to a local directory (the flush's ceiling
//!   when the store is not what limits it).
//! - **fio**: O_DIRECT sequential 4 MiB writes of the same bytes on the cache disk, one job per
//!   writer, as many blocks in flight per job as a [`Writer`] keeps.
//!
//! Then, for each `--write-replicas` R (default 1 and 2), on `--nodes` (default 3) real
//! `pagestored` over loopback with `--write-replicas R`, over `write=back` mounts of the same
//! two stores:
//!
//! - **client**: the writers through the client library ([`Client::create`], `write_bytes`,
//!   `close`): the time each writer is blocked (create to close, durable on R nodes), the
//!   throughput, the CPU seconds per GB of this process (the writers and their client) and of
//!   the nodes; then the flush: from the first close until `write_back_state` shows nothing
//!   waiting, its bytes per second against the store's write bandwidth;
//! - **pagefs**: the same checkpoint through a pagefs mount of the cluster (create, 4 MiB
//!   writes, fsync, close). A pagefs that takes no writes (the first one fails with EROFS,
//!   EPERM, ENOTSUP or ENOSYS) is reported as such, not as a failure;
//! - **client, un-throttled store**: the client leg again over the local-directory store, so
//!   that the flush path of the cluster itself shows.
//!
//! Every file that reaches a store is read back and compared with what was written (crc32).
//! Data directories are removed as each part ends.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};
use bytes::{Bytes, BytesMut};
use futures_util::{stream::FuturesUnordered, StreamExt};
use pagestore_client::{ufs::MountTable, Client, ClientOptions, WriteOptions, Writer};
use pagestore_testkit::{
    data::{Xorshift, GOLDEN},
    local_cluster::{LocalCluster, Settings},
};

use crate::{
    bench::proc_cpu,
    frontends::{check_space, tool_binary, FuseMount},
    local::cpu_seconds,
    modes::{load_warning, loadavg},
    Opts,
};

/// Bytes of each write a writer makes (`torch.save` writes a tensor's storage at a time).
pub const CHUNK: usize = 4 << 20;

/// Bytes of one part of a multipart write to the store: the cluster flusher's part
/// (`WriteBackSettings::flush_part` in pagestored).
pub const PART: usize = 16 << 20;

/// Parts one file's multipart write keeps in flight: the cluster flusher's.
pub const PARTS_IN_FLIGHT: usize = 4;

/// Targets of issue 17.
pub const BLOCKED_TARGET: f64 = 8.0;
/// R = 1 write-back throughput against fio's O_DIRECT write throughput.
pub const FIO_TARGET: f64 = 0.7;
/// Flush throughput against the store's write bandwidth.
pub const FLUSH_TARGET: f64 = 0.9;

/// The emulated store's defaults (the "distant store").
const LATENCY_MS: f64 = 20.0;
const MBPS: f64 = 25.0;

/// The checkpoint's bytes: a pool of distinct 4 MiB chunks, writer `w`'s chunk `i` being
/// `pool[(5 w + i) % pool]` (cut short at the end of the file).
struct Data {
    pool: Vec<Bytes>,
    file_size: u64,
    writers: usize,
}

impl Data {
    fn new(seed: u64, writers: usize, file_size: u64) -> Data {
        let chunk = (CHUNK as u64).min(file_size.max(1)) as usize;
        let pool = (0..16u64)
            .map(|i| {
                let mut b = vec![0u8; chunk];
                Xorshift::new(seed.wrapping_mul(GOLDEN) ^ (0xC4EC_0000 + i)).fill(&mut b);
                Bytes::from(b)
            })
            .collect();
        Data {
            pool,
            file_size,
            writers,
        }
    }

    fn chunk_len(&self) -> u64 {
        self.pool[0].len() as u64
    }

    /// Writer `w`'s writes: (offset, bytes) in order.
    fn writes(&self, w: usize) -> impl Iterator<Item = (u64, Bytes)> + '_ {
        let step = self.chunk_len();
        (0..self.file_size.div_ceil(step)).map(move |i| {
            let at = i * step;
            let b = &self.pool[(5 * w + i as usize) % self.pool.len()];
            (at, b.slice(..(self.file_size - at).min(step) as usize))
        })
    }

    /// The crc32 of writer `w`'s file.
    fn crc(&self, w: usize) -> u32 {
        let mut h = crc32fast::Hasher::new();
        for (_, b) in self.writes(w) {
            h.update(&b);
        }
        h.finalize()
    }

    fn total(&self) -> u64 {
        self.file_size * self.writers as u64
    }
}

/// What the writers of one checkpoint did.
struct Written {
    /// Seconds each writer was blocked (its create, or first write, to its close).
    blocked: Vec<f64>,
    /// First start to last close.
    wall: f64,
    /// When the first and the last writer closed.
    first_close: Instant,
    last_close: Instant,
    /// CPU seconds of this process, of the nodes and of the front end over the writes.
    cpu_self: f64,
    cpu_nodes: f64,
    cpu_frontend: Option<f64>,
}

impl Written {
    fn slowest(&self) -> f64 {
        self.blocked.iter().copied().fold(0.0, f64::max)
    }

    fn mean(&self) -> f64 {
        self.blocked.iter().sum::<f64>() / self.blocked.len().max(1) as f64
    }
}

/// The flush of one checkpoint.
struct Flushed {
    /// From the first close until nothing waits.
    secs: f64,
    /// From the last close until nothing waits.
    lag: f64,
    bytes: u64,
    cpu_nodes: f64,
    /// The last flush error the node answering `write_back_state` reported meanwhile (the
    /// flusher retries failed flushes).
    last_error: Option<String>,
}

impl Flushed {
    fn bps(&self) -> f64 {
        self.bytes as f64 / self.secs.max(1e-9)
    }
}

/// A reference write straight to a store.
struct Straight {
    name: String,
    in_flight: usize,
    written: Written,
    bytes: u64,
}

impl Straight {
    fn bps(&self) -> f64 {
        self.bytes as f64 / self.written.wall.max(1e-9)
    }
}

/// One write-back leg.
struct Leg {
    name: String,
    replicas: u8,
    store: &'static str,
    bytes: u64,
    written: Written,
    flushed: Flushed,
}

impl Leg {
    fn bps(&self) -> f64 {
        self.bytes as f64 / self.written.wall.max(1e-9)
    }
}

struct Report {
    setup: serde_json::Value,
    load_before: [f64; 3],
    load_after: [f64; 3],
    warning: Option<String>,
    straight: Vec<Straight>,
    unthrottled: Straight,
    fio_bps: f64,
    fio_qd: usize,
    legs: Vec<Leg>,
    notes: Vec<String>,
}

/// Runs the whole comparison and prints it.
pub fn run_checkpoint(o: &Opts) -> Result<()> {
    let nodes = o.nodes.unwrap_or(3);
    let replicas = o.replicas_for(nodes)?;
    let writers = o.writers;
    let data = Data::new(o.seed, writers, o.size / writers as u64);
    if data.file_size == 0 {
        bail!("--size must give every writer at least one byte");
    }
    let total = data.total();
    let work = o.dir.join("checkpoint");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).with_context(|| work.display().to_string())?;
    let work = std::fs::canonicalize(&work)?;
    let r = run_all(o, &work, &data, nodes, &replicas);
    let _ = std::fs::remove_dir_all(&work);
    let mut report = r?;
    report.load_after = loadavg();
    report.setup["bytes"] = total.into();
    if o.json {
        println!("{}", report_json(&report));
    } else {
        print_report(&report);
    }
    Ok(())
}

fn emulation(o: &Opts) -> (f64, f64) {
    (
        o.ufs_latency_ms.unwrap_or(LATENCY_MS),
        o.ufs_mbps.unwrap_or(MBPS),
    )
}

fn run_all(o: &Opts, work: &Path, data: &Data, nodes: usize, replicas: &[u8]) -> Result<Report> {
    let warning = load_warning();
    let load_before = loadavg();
    let (ms, mbps) = emulation(o);
    let far = work.join("store");
    let near = work.join("store-fast");
    for d in [&far, &near] {
        std::fs::create_dir_all(d).with_context(|| d.display().to_string())?;
    }
    let far_url = format!(
        "file://{}?emulate_latency_ms={ms}&emulate_mbps={mbps}",
        far.display()
    );
    let near_url = format!("file://{}", near.display());
    let total = data.total();
    // The references and fio write the checkpoint once at a time; a cluster holds R copies
    // in its caches and one in a store.
    check_space(work, total + total / 4)?;
    let rt = crate::bench::runtime(2)?;
    let table = Arc::new(MountTable::new(&[
        ("/far".to_string(), far_url.clone()),
        ("/near".to_string(), near_url.clone()),
    ])?);
    let mut straight = Vec::new();
    for in_flight in [1, PARTS_IN_FLIGHT] {
        let name = format!(
            "store, straight ({in_flight} part{} in flight per writer)",
            if in_flight == 1 { "" } else { "s" }
        );
        progress(format!("{name}: writing"));
        let written = rt.block_on(write_store(&table, "/far/ref", data, in_flight))?;
        verify_dir(&far.join("ref"), data).context("the store's copy")?;
        let _ = std::fs::remove_dir_all(far.join("ref"));
        straight.push(Straight {
            name,
            in_flight,
            written,
            bytes: total,
        });
    }
    progress("the un-throttled store (a local directory): writing".into());
    let written = rt.block_on(write_store(&table, "/near/ref", data, PARTS_IN_FLIGHT))?;
    verify_dir(&near.join("ref"), data).context("the local directory's copy")?;
    let _ = std::fs::remove_dir_all(near.join("ref"));
    let unthrottled = Straight {
        name: format!("store un-throttled (local directory, {PARTS_IN_FLIGHT} in flight)"),
        in_flight: PARTS_IN_FLIGHT,
        written,
        bytes: total,
    };
    let fio_qd = WriteOptions::default().inflight;
    progress("fio: O_DIRECT sequential writes on the cache disk".into());
    let fio_bps = fio_write(o, work, data, fio_qd)?;

    let mut legs = Vec::new();
    let mut notes = Vec::new();
    for &r in replicas {
        let setup = ClusterSetup {
            nodes,
            replicas: r,
            far: format!("{far_url}&write=back"),
            near: format!("{near_url}?write=back"),
        };
        let dir = work.join(format!("nodes-r{r}"));
        let result = run_cluster(o, &dir, &setup, data, &rt, &far, &near, &mut notes);
        let _ = std::fs::remove_dir_all(&dir);
        legs.extend(result?);
    }
    Ok(Report {
        setup: serde_json::json!({
            "writers": data.writers, "file_size": data.file_size, "write_size": data.chunk_len(),
            "nodes": nodes, "shards": o.shards, "page_size": o.page_size,
            "write_replicas": replicas, "store_latency_ms": ms, "store_mbps_per_request": mbps,
            "part_size": PART, "parts_in_flight": PARTS_IN_FLIGHT,
        }),
        load_before,
        load_after: [f64::NAN; 3],
        warning,
        straight,
        unthrottled,
        fio_bps,
        fio_qd,
        legs,
        notes,
    })
}

/// fio's O_DIRECT sequential write of the same bytes on the cache disk: one job per writer,
/// `qd` blocks of the write size in flight each.
fn fio_write(o: &Opts, work: &Path, data: &Data, qd: usize) -> Result<f64> {
    let f = Opts {
        dir: work.to_path_buf(),
        size: data.total(),
        shards: data.writers,
        qd,
        page_size: data.chunk_len() as u32,
        ..o.clone()
    };
    let r = crate::fio::run_fio(&f, "write", crate::fio::Variant::Plain);
    let _ = std::fs::remove_dir_all(work.join("fio"));
    Ok(r?.bw)
}

/// Writes the checkpoint under `prefix` of `table` (the store, straight): each writer buffers
/// its writes into [`PART`] parts and keeps `in_flight` of them in flight; a file of at most one
/// part is one put.
async fn write_store(
    table: &Arc<MountTable>,
    prefix: &str,
    data: &Data,
    in_flight: usize,
) -> Result<Written> {
    let c0 = cpu_seconds();
    let start = Instant::now();
    let tasks: Vec<_> = (0..data.writers)
        .map(|w| {
            let table = table.clone();
            let path = format!("{prefix}/w{w}");
            let writes: Vec<(u64, Bytes)> = data.writes(w).collect();
            tokio::spawn(async move {
                let t0 = Instant::now();
                store_writer(&table, &path, writes, in_flight).await?;
                Ok::<_, anyhow::Error>((t0, Instant::now()))
            })
        })
        .collect();
    let mut spans = Vec::new();
    for t in tasks {
        spans.push(t.await.map_err(|e| anyhow!("a writer stopped: {e}"))??);
    }
    Ok(written(start, &spans, cpu_seconds() - c0, 0.0, None))
}

/// One writer straight to the store.
async fn store_writer(
    table: &MountTable,
    path: &str,
    writes: Vec<(u64, Bytes)>,
    in_flight: usize,
) -> Result<()> {
    let mut buf = BytesMut::new();
    let mut upload = None;
    let mut parts = FuturesUnordered::new();
    for (_, b) in writes {
        buf.extend_from_slice(&b);
        while buf.len() > PART {
            if upload.is_none() {
                upload = Some(table.put_multipart(path).await?);
            }
            let part = buf.split_to(PART).freeze();
            if let Some(u) = upload.as_mut() {
                parts.push(u.put_part(part.into()));
            }
            while parts.len() >= in_flight.max(1) {
                if let Some(r) = parts.next().await {
                    r.with_context(|| format!("a part of {path}"))?;
                }
            }
        }
    }
    match upload {
        None => table.put(path, buf.freeze()).await?,
        Some(mut u) => {
            if !buf.is_empty() {
                parts.push(u.put_part(buf.freeze().into()));
            }
            while let Some(r) = parts.next().await {
                r.with_context(|| format!("a part of {path}"))?;
            }
            drop(parts);
            u.complete()
                .await
                .with_context(|| format!("completing {path}"))?;
        }
    }
    Ok(())
}

/// Builds a [`Written`] from each writer's (start, close).
fn written(
    start: Instant,
    spans: &[(Instant, Instant)],
    cpu_self: f64,
    cpu_nodes: f64,
    cpu_frontend: Option<f64>,
) -> Written {
    let first_close = spans.iter().map(|s| s.1).min().unwrap_or(start);
    let last_close = spans.iter().map(|s| s.1).max().unwrap_or(start);
    Written {
        blocked: spans
            .iter()
            .map(|(a, b)| b.duration_since(*a).as_secs_f64())
            .collect(),
        wall: last_close.duration_since(start).as_secs_f64(),
        first_close,
        last_close,
        cpu_self,
        cpu_nodes,
        cpu_frontend,
    }
}

/// Checks that `dir` holds every writer's file with the bytes written.
fn verify_dir(dir: &Path, data: &Data) -> Result<()> {
    for w in 0..data.writers {
        let path = dir.join(format!("w{w}"));
        let got = crc_of(&path)?;
        if got != (data.file_size, data.crc(w)) {
            bail!(
                "{}: {} bytes with crc32 {:08x}, {} bytes with {:08x} written",
                path.display(),
                got.0,
                got.1,
                data.file_size,
                data.crc(w)
            );
        }
    }
    Ok(())
}

fn crc_of(path: &Path) -> Result<(u64, u32)> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).with_context(|| path.display().to_string())?;
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            return Ok((n, h.finalize()));
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
}

struct ClusterSetup {
    nodes: usize,
    replicas: u8,
    far: String,
    near: String,
}

fn node_cpu(c: &LocalCluster) -> f64 {
    c.nodes
        .iter()
        .filter_map(|n| n.child.as_ref())
        .map(|ch| proc_cpu(ch.id()))
        .sum()
}

/// Cache bytes per node: room for R copies of the checkpoint spread over the nodes, with half
/// again for uneven placement and some pages per shard, all of it allowed dirty (the writers
/// close before anything is flushed).
fn cache_per_node(o: &Opts, data: &Data, s: &ClusterSetup) -> u64 {
    let page = u64::from(o.page_size);
    let pages = data.file_size.div_ceil(page) * data.writers as u64 * u64::from(s.replicas);
    let share = pages.div_ceil(s.nodes as u64) * page;
    (share * 3 / 2 + 8 * page * o.shards as u64 + (64 << 20)).div_ceil(1 << 20) << 20
}

#[allow(clippy::too_many_arguments)]
fn run_cluster(
    o: &Opts,
    dir: &Path,
    s: &ClusterSetup,
    data: &Data,
    rt: &tokio::runtime::Runtime,
    far: &Path,
    near: &Path,
    notes: &mut Vec<String>,
) -> Result<Vec<Leg>> {
    let binary = tool_binary("pagestored")?;
    let _ = std::fs::remove_dir_all(dir);
    let cache = cache_per_node(o, data, s);
    check_space(
        far.parent().unwrap_or(far),
        cache * s.nodes as u64 + data.total(),
    )?;
    let mut settings = Settings::new(&binary, dir);
    settings.nodes = s.nodes;
    settings.shards = u16::try_from(o.shards).map_err(|_| anyhow!("--shards: too many"))?;
    settings.page_size = o.page_size.to_string();
    settings.cache_size = cache.to_string();
    settings.mounts = vec![format!("/ckpt={}", s.far), format!("/fast={}", s.near)];
    settings.extra = vec![
        "--write-replicas".into(),
        s.replicas.to_string(),
        "--dirty-limit".into(),
        cache.to_string(),
    ];
    progress(format!(
        "starting {} nodes with --write-replicas {} ({} MB of cache each)",
        s.nodes,
        s.replicas,
        cache >> 20
    ));
    let cluster = LocalCluster::start(settings).map_err(anyhow::Error::msg)?;
    let client = rt
        .block_on(cluster.client(writer_options()))
        .map_err(anyhow::Error::msg)?;
    if client.write_replicas() != s.replicas {
        bail!(
            "the cluster keeps {} write replicas, {} asked",
            client.write_replicas(),
            s.replicas
        );
    }
    let r = s.replicas;
    let mut legs = Vec::new();

    let (written, flushed) =
        client_leg(&cluster, &client, rt, &format!("/ckpt/client-r{r}"), data)?;
    finish_leg(&far.join(format!("client-r{r}")), data)?;
    legs.push(Leg {
        name: format!("client, R={r}"),
        replicas: r,
        store: "emulated",
        bytes: data.total(),
        written,
        flushed,
    });

    match pagefs_leg(&cluster, &client, rt, dir, r, data)? {
        PagefsOutcome::Done(written, flushed) => {
            finish_leg(&far.join(format!("pagefs-r{r}")), data)?;
            legs.push(Leg {
                name: format!("pagefs, R={r}"),
                replicas: r,
                store: "emulated",
                bytes: data.total(),
                written,
                flushed,
            });
        }
        PagefsOutcome::NotRun(why) => notes.push(format!("pagefs: {why}")),
    }

    let (written, flushed) =
        client_leg(&cluster, &client, rt, &format!("/fast/client-r{r}"), data)?;
    finish_leg(&near.join(format!("client-r{r}")), data)?;
    legs.push(Leg {
        name: format!("client, R={r}, un-throttled store"),
        replicas: r,
        store: "local directory",
        bytes: data.total(),
        written,
        flushed,
    });
    Ok(legs)
}

/// The writers' client settings: the defaults but for patience with nodes that are slow to
/// answer. By default a request is given up (and its node backed off) when the node answers
/// nothing, not even a ping, for 4x its usual answer time (at least 200 ms) or 3 s; on a
/// machine whose CPUs are shared with other work a node starved for that long is backed off,
/// and a page whose write members are all backed off fails its write. The benchmark measures
/// speed, so it waits instead.
pub fn writer_options() -> ClientOptions {
    ClientOptions {
        call_timeout: Duration::from_secs(30),
        min_silence: Duration::from_secs(2),
        ..ClientOptions::default()
    }
}

/// A line on standard error about what runs now.
fn progress(line: String) {
    eprintln!("checkpoint: {line}");
}

/// Checks a leg's files in the store, then removes them.
fn finish_leg(dir: &Path, data: &Data) -> Result<()> {
    let r = verify_dir(dir, data).context("the flushed copy in the store");
    let _ = std::fs::remove_dir_all(dir);
    r
}

/// The writers through the client library, then the flush.
fn client_leg(
    cluster: &LocalCluster,
    client: &Arc<Client>,
    rt: &tokio::runtime::Runtime,
    prefix: &str,
    data: &Data,
) -> Result<(Written, Flushed)> {
    progress(format!("{prefix}: writing through the client library"));
    let (c0, n0) = (cpu_seconds(), node_cpu(cluster));
    let start = Instant::now();
    let spans = rt.block_on(async {
        let tasks: Vec<_> = (0..data.writers)
            .map(|w| {
                let client = client.clone();
                let path = format!("{prefix}/w{w}");
                let writes: Vec<(u64, Bytes)> = data.writes(w).collect();
                tokio::spawn(async move {
                    let t0 = Instant::now();
                    let mut f: Writer = client.create(&path, WriteOptions::default()).await?;
                    for (at, b) in writes {
                        f.write_bytes(at, b).await?;
                    }
                    f.close().await?;
                    Ok::<_, anyhow::Error>((t0, Instant::now()))
                })
            })
            .collect();
        let mut spans = Vec::new();
        for t in tasks {
            spans.push(t.await.map_err(|e| anyhow!("a writer stopped: {e}"))??);
        }
        Ok::<_, anyhow::Error>(spans)
    })?;
    let w = written(
        start,
        &spans,
        cpu_seconds() - c0,
        node_cpu(cluster) - n0,
        None,
    );
    let f = rt.block_on(wait_flushed(cluster, client, prefix, &w, data.total()))?;
    Ok((w, f))
}

/// Polls `write_back_state(prefix)` every 20 ms until nothing under it waits for the store.
async fn wait_flushed(
    cluster: &LocalCluster,
    client: &Client,
    prefix: &str,
    w: &Written,
    bytes: u64,
) -> Result<Flushed> {
    progress(format!("{prefix}: waiting for the flush"));
    let n0 = node_cpu(cluster);
    // Generous: a store at 1 MB/s would still make it.
    let limit = Duration::from_secs(120) + Duration::from_secs(bytes / 1_000_000);
    let polled = Instant::now();
    let mut errors = None;
    loop {
        let s = client.write_back_state(prefix).await?;
        if !s.last_error.is_empty() {
            errors = Some(s.last_error.clone());
        }
        if s.files_dirty == 0 && s.deletes_pending == 0 {
            let done = Instant::now();
            return Ok(Flushed {
                secs: done.duration_since(w.first_close).as_secs_f64(),
                lag: done.duration_since(w.last_close).as_secs_f64(),
                bytes,
                cpu_nodes: node_cpu(cluster) - n0,
                last_error: errors,
            });
        }
        if polled.elapsed() > limit {
            bail!(
                "{prefix}: not flushed after {:.0} s ({} files, {} bytes waiting; last error: {})",
                limit.as_secs_f64(),
                s.files_dirty,
                s.bytes_dirty,
                if s.last_error.is_empty() {
                    "none"
                } else {
                    &s.last_error
                }
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

enum PagefsOutcome {
    Done(Written, Flushed),
    NotRun(String),
}

/// Whether an error of the first write through pagefs says that it takes no writes.
fn writes_unsupported(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EROFS | libc::EPERM | libc::ENOTSUP | libc::ENOSYS)
    )
}

/// The writers through a pagefs mount of the cluster: create, 4 MiB writes, fsync, close.
fn pagefs_leg(
    cluster: &LocalCluster,
    client: &Arc<Client>,
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    r: u8,
    data: &Data,
) -> Result<PagefsOutcome> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
        return Ok(PagefsOutcome::NotRun(format!(
            "not run (R={r}): a pagefs mount needs root and /dev/fuse"
        )));
    }
    if let Err(e) = tool_binary("pagefs") {
        return Ok(PagefsOutcome::NotRun(format!("not run (R={r}): {e:#}")));
    }
    let logical = format!("/ckpt/pagefs-r{r}");
    rt.block_on(client.make_dir(&logical))
        .with_context(|| format!("making {logical}"))?;
    progress(format!("{logical}: writing through pagefs"));
    let mount = FuseMount::start(cluster, &dir.join("mnt"), None)?;
    let files: Vec<PathBuf> = (0..data.writers)
        .map(|w| {
            mount
                .mp
                .join(logical.trim_start_matches('/'))
                .join(format!("w{w}"))
        })
        .collect();
    let (c0, n0, f0) = (cpu_seconds(), node_cpu(cluster), proc_cpu(mount.pid));
    let start = Instant::now();
    let results: Vec<Result<(Instant, Instant), PagefsError>> = std::thread::scope(|sc| {
        let handles: Vec<_> = files
            .iter()
            .enumerate()
            .map(|(w, path)| sc.spawn(move || pagefs_writer(path, data.writes(w))))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(PagefsError::Failed(anyhow!("a writer panicked"))))
            })
            .collect()
    });
    let (cpu_self, cpu_nodes, cpu_fe) = (
        cpu_seconds() - c0,
        node_cpu(cluster) - n0,
        proc_cpu(mount.pid) - f0,
    );
    let mut spans = Vec::new();
    let mut unsupported = None;
    for r in results {
        match r {
            Ok(s) => spans.push(s),
            Err(PagefsError::Unsupported(e)) => unsupported = Some(e),
            Err(PagefsError::Failed(e)) => return Err(e.context("writing through pagefs")),
        }
    }
    if let Some(e) = unsupported {
        if !spans.is_empty() {
            bail!("pagefs took some writers' files and refused others: {e}");
        }
        return Ok(PagefsOutcome::NotRun(format!(
            "writes not supported by this build (R={r}; the first write: {e})"
        )));
    }
    let w = written(start, &spans, cpu_self, cpu_nodes, Some(cpu_fe));
    let f = rt.block_on(wait_flushed(cluster, client, &logical, &w, data.total()))?;
    drop(mount);
    Ok(PagefsOutcome::Done(w, f))
}

enum PagefsError {
    /// The first operation was refused: pagefs takes no writes.
    Unsupported(std::io::Error),
    Failed(anyhow::Error),
}

fn pagefs_writer(
    path: &Path,
    writes: impl Iterator<Item = (u64, Bytes)>,
) -> Result<(Instant, Instant), PagefsError> {
    let t0 = Instant::now();
    let first = |e: std::io::Error| {
        if writes_unsupported(&e) {
            PagefsError::Unsupported(e)
        } else {
            PagefsError::Failed(anyhow::Error::new(e).context(path.display().to_string()))
        }
    };
    let later = |e: std::io::Error| {
        PagefsError::Failed(anyhow::Error::new(e).context(path.display().to_string()))
    };
    let mut f = std::fs::File::create(path).map_err(first)?;
    for (i, (_, b)) in writes.enumerate() {
        f.write_all(&b)
            .map_err(|e| if i == 0 { first(e) } else { later(e) })?;
    }
    f.sync_all().map_err(later)?;
    drop(f);
    Ok((t0, Instant::now()))
}

// -- the report -----------------------------------------------------------------------------

fn mb(bps: f64) -> f64 {
    bps / 1e6
}

fn per_gb(cpu: f64, bytes: u64) -> f64 {
    cpu / (bytes as f64 / 1e9).max(1e-12)
}

fn print_report(r: &Report) {
    let s = &r.setup;
    println!(
        "checkpoint: {:.2} GB from {} writers ({:.1} MB each, {} KiB writes, then close); {} \
         nodes x {} shard(s), {} KiB pages",
        s["bytes"].as_f64().unwrap_or(0.0) / 1e9,
        s["writers"],
        s["file_size"].as_f64().unwrap_or(0.0) / 1e6,
        s["write_size"].as_u64().unwrap_or(0) >> 10,
        s["nodes"],
        s["shards"],
        s["page_size"].as_u64().unwrap_or(0) >> 10,
    );
    println!(
        "emulated store: {} ms and {} MB/s per request; store writes of {} MiB parts",
        s["store_latency_ms"],
        s["store_mbps_per_request"],
        PART >> 20
    );
    println!(
        "load average {:.2} before, {:.2} after",
        r.load_before[0], r.load_after[0]
    );
    if let Some(w) = &r.warning {
        println!("{w}");
    }
    println!("\nreferences (this run)");
    println!(
        "  {:<52} {:>10} {:>10} {:>9}",
        "", "blocked s", "mean s", "MB/s"
    );
    for st in r.straight.iter().chain(std::iter::once(&r.unthrottled)) {
        println!(
            "  {:<52} {:>10.2} {:>10.2} {:>9.1}",
            st.name,
            st.written.slowest(),
            st.written.mean(),
            mb(st.bps())
        );
    }
    println!(
        "  {:<52} {:>10} {:>10} {:>9.1}",
        format!(
            "fio O_DIRECT write ({} jobs x {} deep, {} KiB)",
            s["writers"],
            r.fio_qd,
            s["write_size"].as_u64().unwrap_or(0) >> 10
        ),
        "",
        "",
        mb(r.fio_bps)
    );
    let seq = &r.straight[0];
    let par = &r.straight[r.straight.len() - 1];
    println!("\nwrites (blocked: the slowest writer's create to close; vs store: how many times shorter)");
    println!(
        "  {:<34} {:>9} {:>8} {:>9} {:>9} {:>9} {:>8} {:>9} {:>9}",
        "leg",
        "blocked s",
        "mean s",
        "MB/s",
        "vs store1",
        "vs store4",
        "vs fio",
        "CPU s/GB",
        "nodes s/GB"
    );
    for l in &r.legs {
        let w = &l.written;
        println!(
            "  {:<34} {:>9.2} {:>8.2} {:>9.1} {:>8.2}x {:>8.2}x {:>7.2}x {:>9.2} {:>9.2}{}",
            l.name,
            w.slowest(),
            w.mean(),
            mb(l.bps()),
            seq.written.slowest() / w.slowest(),
            par.written.slowest() / w.slowest(),
            l.bps() / r.fio_bps,
            per_gb(w.cpu_self, l.bytes),
            per_gb(w.cpu_nodes, l.bytes),
            w.cpu_frontend.map_or(String::new(), |c| format!(
                "  (pagefs {:.2} s/GB)",
                per_gb(c, l.bytes)
            )),
        );
    }
    println!("\nflushes (from the first close until write_back_state shows nothing waiting)");
    println!(
        "  {:<34} {:>9} {:>12} {:>9} {:>9} {:>10}",
        "leg", "flush s", "after last", "MB/s", "vs store", "nodes s/GB"
    );
    for l in &r.legs {
        let f = &l.flushed;
        let store = store_of(r, l);
        println!(
            "  {:<34} {:>9.2} {:>11.2}s {:>9.1} {:>8.2}x {:>10.2}",
            l.name,
            f.secs,
            f.lag,
            mb(f.bps()),
            f.bps() / store.bps(),
            per_gb(f.cpu_nodes, f.bytes)
        );
    }
    for l in &r.legs {
        if let Some(e) = &l.flushed.last_error {
            println!("  {}: a flush failed and was retried: {e}", l.name);
        }
    }
    for n in &r.notes {
        println!("  {n}");
    }
    println!("\ntargets (issue 17)");
    for l in r.legs.iter().filter(|l| l.store == "emulated") {
        println!(
            "  {}: writers blocked {:.2}x shorter than the store straight with 1 part in flight, \
             {:.2}x with {PARTS_IN_FLIGHT} (target >= {BLOCKED_TARGET}x)",
            l.name,
            seq.written.slowest() / l.written.slowest(),
            par.written.slowest() / l.written.slowest()
        );
    }
    for l in r
        .legs
        .iter()
        .filter(|l| l.replicas == 1 && l.store == "emulated")
    {
        println!(
            "  {}: throughput / fio O_DIRECT write = {:.2}x (target >= {FIO_TARGET}x)",
            l.name,
            l.bps() / r.fio_bps
        );
    }
    for l in r.legs.iter().filter(|l| l.store == "emulated") {
        println!(
            "  {}: flush / the store's write bandwidth ({PARTS_IN_FLIGHT} parts in flight per \
             file) = {:.2}x (target >= {FLUSH_TARGET}x)",
            l.name,
            l.flushed.bps() / par.bps()
        );
    }
    println!("  every file in the stores read back byte-exact (crc32)");
}

/// The reference a leg's flush is compared with: the store it flushes to, written straight
/// with as many parts in flight as the flusher keeps.
fn store_of<'a>(r: &'a Report, l: &Leg) -> &'a Straight {
    if l.store == "emulated" {
        &r.straight[r.straight.len() - 1]
    } else {
        &r.unthrottled
    }
}

fn written_json(w: &Written, bytes: u64) -> serde_json::Value {
    serde_json::json!({
        "blocked_secs_max": w.slowest(), "blocked_secs_mean": w.mean(),
        "blocked_secs": w.blocked, "wall_secs": w.wall,
        "bytes_per_sec": bytes as f64 / w.wall.max(1e-9),
        "cpu_seconds_per_gb": {
            "writer": per_gb(w.cpu_self, bytes),
            "nodes": per_gb(w.cpu_nodes, bytes),
            "frontend": w.cpu_frontend.map(|c| per_gb(c, bytes)),
        },
    })
}

fn report_json(r: &Report) -> serde_json::Value {
    let seq = &r.straight[0];
    let par = &r.straight[r.straight.len() - 1];
    let straight: Vec<_> = r
        .straight
        .iter()
        .map(|s| {
            let mut v = written_json(&s.written, s.bytes);
            v["name"] = s.name.clone().into();
            v["parts_in_flight"] = s.in_flight.into();
            v
        })
        .collect();
    let mut unthrottled = written_json(&r.unthrottled.written, r.unthrottled.bytes);
    unthrottled["name"] = r.unthrottled.name.clone().into();
    let legs: Vec<_> = r
        .legs
        .iter()
        .map(|l| {
            let f = &l.flushed;
            let store = store_of(r, l);
            let mut v = written_json(&l.written, l.bytes);
            v["name"] = l.name.clone().into();
            v["write_replicas"] = l.replicas.into();
            v["store"] = l.store.into();
            v["blocked_shorter_than_store"] = serde_json::json!({
                "one_part_in_flight": seq.written.slowest() / l.written.slowest(),
                "parts_in_flight": par.written.slowest() / l.written.slowest(),
            });
            v["over_fio"] = (l.bps() / r.fio_bps).into();
            v["flush"] = serde_json::json!({
                "secs": f.secs, "lag_after_last_close_secs": f.lag, "bytes": f.bytes,
                "bytes_per_sec": f.bps(), "over_store": f.bps() / store.bps(),
                "nodes_cpu_seconds_per_gb": per_gb(f.cpu_nodes, f.bytes),
                "last_error": f.last_error,
            });
            v
        })
        .collect();
    serde_json::json!({
        "mode": "checkpoint",
        "setup": r.setup,
        "load_average_before": r.load_before,
        "load_average_after": r.load_after,
        "warning": r.warning,
        "references": {
            "store_straight": straight,
            "store_unthrottled": unthrottled,
            "fio_write": {"bytes_per_sec": r.fio_bps, "jobs": r.setup["writers"],
                "iodepth": r.fio_qd},
        },
        "legs": legs,
        "notes": r.notes,
        "targets": {"blocked_shorter": BLOCKED_TARGET, "r1_over_fio": FIO_TARGET,
            "flush_over_store": FLUSH_TARGET},
        "byte_exact": true,
    })
}
