//! The `fanout` target (issue 18, "fetch once, serve many"): one file of `--size` (default 2 GB,
//! "model weights") read whole by each of `--readers` readers (default 8 and 32), spread over
//! several client instances on the client side of 3 real `pagestored` processes, behind an
//! emulated distant store (default 20 ms and 25 MB/s per request). Measured in the same run:
//!
//! - **direct**: every reader reads the whole file from the emulated store itself (the
//!   reference: what each replica or data loader does without the cache);
//! - **cold** and **warm** fan-out through the cluster, without and with the memory tier
//!   (`--memory-cache`), without and with hot-page replicas (`--hot-replicas 1` and the
//!   default 3): all readers' completion time, aggregate throughput, store bytes read (must be
//!   the file's size, once, when cold), per-node bytes served max/mean;
//! - **hot page**: every reader re-reads the file's first page for `--seconds` (after half a
//!   second to warm up): one page everyone wants, served by its owner alone without replicas
//!   and by 3 nodes with them: aggregate throughput and per-node bytes max/mean;
//! - **same shard**: warm whole-page reads of only the pages one shard owns, from its disk cache
//!   (memory tier off) and from its memory tier: throughput and the node's CPU per GB.
//!
//! Every reader checks its bytes (reader 0 every page, the others every `--verify`th) against
//! crc32s of the file.

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use futures_util::{stream, StreamExt};
use pagestore_client::{
    ufs::{MountTable, ObjectInfo},
    Client, ClientOptions, ShardCounters, StatsSnapshot,
};
use pagestore_protocol::members::NodeInfo;
use pagestore_testkit::{
    data::{Xorshift, GOLDEN},
    local_cluster::{LocalCluster, Settings},
};

use crate::{bench::proc_cpu, Opts};

/// Readers per client instance (one client per "machine").
const READERS_PER_CLIENT: usize = 8;

/// One measured fan-out pass.
#[derive(Clone, Debug)]
struct Pass {
    name: String,
    readers: usize,
    memory_tier: bool,
    /// Hot-page replicas on.
    replicas: bool,
    /// Client reads a hot page's replica answered.
    hot_reads: u64,
    /// Until the last reader had the whole file.
    seconds: f64,
    /// The first and the median reader's completion, seconds.
    first_done: f64,
    median_done: f64,
    bytes: u64,
    gbps: f64,
    /// Bytes the nodes read from the store during the pass, and page loads.
    store_bytes: u64,
    store_reads: u64,
    /// Bytes each node served during the pass.
    node_bytes: Vec<u64>,
    node_max_over_mean: f64,
    /// Memory-tier hits during the pass.
    memory_hits: u64,
    client_fallbacks: u64,
    /// Bytes the clients read from the store themselves (fallbacks and hedges), and their
    /// hedges to the store: the fetch-once accounting's other half.
    client_store_bytes: u64,
    store_hedges: u64,
    /// Why clients left a member: failures (silent ones included), given up as silent, and
    /// store errors a member answered.
    member_failures: u64,
    silent_gives_up: u64,
    store_errors: u64,
    server_cpu_seconds: f64,
    client_cpu_seconds: f64,
}

impl Pass {
    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name, "readers": self.readers, "memory_tier": self.memory_tier,
            "replicas": self.replicas, "hot_reads": self.hot_reads,
            "seconds": self.seconds, "first_done": self.first_done,
            "median_done": self.median_done, "bytes": self.bytes, "gbps": self.gbps,
            "store_bytes": self.store_bytes, "store_reads": self.store_reads,
            "node_bytes": self.node_bytes, "node_max_over_mean": self.node_max_over_mean,
            "memory_hits": self.memory_hits, "client_fallbacks": self.client_fallbacks,
            "client_store_bytes": self.client_store_bytes, "store_hedges": self.store_hedges,
            "member_failures": self.member_failures, "silent_gives_up": self.silent_gives_up,
            "server_cpu_seconds": self.server_cpu_seconds,
            "client_cpu_seconds": self.client_cpu_seconds,
        })
    }
}

/// Writes the file (kept between runs of the same size and seed).
fn dataset(path: &Path, size: u64, seed: u64) -> Result<()> {
    if std::fs::metadata(path).is_ok_and(|m| m.len() == size) {
        return Ok(());
    }
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).with_context(|| d.display().to_string())?;
    }
    let mut x = Xorshift::new(seed.wrapping_mul(GOLDEN) ^ 0xFA0);
    let mut out = std::fs::File::create(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size as usize;
    while left > 0 {
        let n = left.min(buf.len());
        x.fill(&mut buf[..n]);
        std::io::Write::write_all(&mut out, &buf[..n])?;
        left -= n;
    }
    Ok(())
}

/// crc32 of every page of the file.
fn reference(path: &Path, page: u64) -> Result<Vec<u32>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; page as usize];
    let mut out = Vec::new();
    loop {
        let mut n = 0;
        while n < buf.len() {
            let r = f.read(&mut buf[n..])?;
            if r == 0 {
                break;
            }
            n += r;
        }
        if n == 0 {
            break;
        }
        out.push(crc32fast::hash(&buf[..n]));
        if n < buf.len() {
            break;
        }
    }
    Ok(out)
}

fn mean(v: &[u64]) -> f64 {
    v.iter().sum::<u64>() as f64 / v.len().max(1) as f64
}

fn max_over_mean(v: &[u64]) -> f64 {
    let m = mean(v);
    if m > 0.0 {
        *v.iter().max().unwrap_or(&0) as f64 / m
    } else {
        1.0
    }
}

/// Runs the whole comparison.
pub fn run_fanout(o: &Opts) -> Result<()> {
    let binary = crate::frontends::tool_binary("pagestored")?;
    let root = o.dir.join("fanout");
    let size = if o.size_given { o.size } else { 2 << 30 };
    let page = u64::from(o.page_size);
    let file = root.join("ufs").join("weights.bin");
    dataset(&file, size, o.seed)?;
    let crcs = Arc::new(reference(&file, page)?);
    let readers: Vec<usize> = if o.readers_given {
        o.readers.clone()
    } else {
        vec![8, 32]
    };
    let latency = o.ufs_latency_ms.unwrap_or(20.0);
    let mbps = o.ufs_mbps.unwrap_or(25.0);
    let url = format!(
        "file://{}?emulate_latency_ms={latency}&emulate_mbps={mbps}",
        file.parent().context("no parent")?.display()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut report = serde_json::Map::new();
    report.insert("mode".into(), "fanout".into());
    report.insert(
        "setup".into(),
        serde_json::json!({"nodes": 3, "shards": o.shards, "bytes": size, "page_size": page,
            "readers": readers, "pages_in_flight_per_reader": o.reader_qd().max(4),
            "store_latency_ms": latency, "store_mbps_per_request": mbps}),
    );
    say(
        o,
        format!(
            "fanout: one file of {:.2} GB, page {} KiB, 3 nodes x {} shard(s), readers {:?} \
             ({} per client instance, {} pages in flight each); store: {latency} ms and {mbps} \
             MB/s per request",
            size as f64 / 1e9,
            page >> 10,
            o.shards,
            readers,
            READERS_PER_CLIENT,
            o.reader_qd().max(4)
        ),
    );

    // The reference: each reader straight from the emulated store.
    let table = Arc::new(MountTable::new(&[("/w".to_string(), url.clone())])?);
    let mut direct = Vec::new();
    for &n in &readers {
        let d = rt.block_on(direct_pass(o, &table, n, page, &crcs))?;
        say(
            o,
            format!(
                "direct from the store, {n} readers: all done in {:.2} s ({:.2} GB/s in all)",
                d.seconds, d.gbps
            ),
        );
        direct.push(d);
    }

    let mut passes = Vec::new();
    let mut shard_tests = Vec::new();
    let configs = [(false, false), (true, false), (false, true), (true, true)];
    for (memory, replicas) in configs {
        let nodes_dir = root.join(format!("nodes-{}-{}", u8::from(memory), u8::from(replicas)));
        let _ = std::fs::remove_dir_all(&nodes_dir);
        let mut s = Settings::new(&binary, &nodes_dir);
        s.shards = o.shards as u16;
        s.page_size = o.page_size.to_string();
        s.cache_size = (size * 2 / 3 + (256 << 20)).to_string();
        s.mounts = vec![format!("/w={url}")];
        s.metadata_ttl = "600".into();
        if memory {
            // Each node's share of the file with room to spare.
            s.extra = vec!["--memory-cache".into(), (size / 2 + (64 << 20)).to_string()];
        }
        if !replicas {
            s.extra.extend(["--hot-replicas".into(), "1".into()]);
        }
        let cluster = LocalCluster::start(s).map_err(anyhow::Error::msg)?;
        let r = rt.block_on(cluster_passes(
            o, &cluster, memory, replicas, &readers, page, &crcs,
        ));
        drop(cluster);
        let _ = std::fs::remove_dir_all(&nodes_dir);
        let (p, shard) = r?;
        passes.extend(p);
        shard_tests.extend(shard);
    }
    report_all(o, size, &direct, &passes, &shard_tests, report)
}

/// Every reader reads the whole file from the store itself, `qd` pages in flight each.
async fn direct_pass(
    o: &Opts,
    table: &Arc<MountTable>,
    readers: usize,
    page: u64,
    crcs: &Arc<Vec<u32>>,
) -> Result<Pass> {
    let info = table.stat("/w/weights.bin").await?;
    let qd = o.reader_qd().max(4);
    let c0 = crate::local::cpu_seconds();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for r in 0..readers {
        let (table, info, crcs) = (table.clone(), info.clone(), crcs.clone());
        let every = if r == 0 { 1 } else { o.verify_every };
        tasks.push(tokio::spawn(async move {
            read_whole(&info, page, qd, every, &crcs, move |info, p| {
                let table = table.clone();
                async move {
                    let start = p * page;
                    Ok(table
                        .read(&info, start..(start + page).min(info.size))
                        .await?)
                }
            })
            .await
            .map(|()| t0.elapsed().as_secs_f64())
        }));
    }
    let mut done = Vec::new();
    for t in tasks {
        done.push(t.await??);
    }
    Ok(pass(
        "direct from the store".into(),
        readers,
        (false, false),
        &done,
        readers as u64 * info.size,
        crate::local::cpu_seconds() - c0,
    ))
}

/// A pass from the completion times of its readers.
fn pass(
    name: String,
    readers: usize,
    (memory_tier, replicas): (bool, bool),
    done: &[f64],
    bytes: u64,
    client_cpu: f64,
) -> Pass {
    let mut d = done.to_vec();
    d.sort_by(f64::total_cmp);
    let seconds = d.last().copied().unwrap_or(0.0).max(1e-9);
    Pass {
        name,
        readers,
        memory_tier,
        replicas,
        hot_reads: 0,
        seconds,
        first_done: d.first().copied().unwrap_or(0.0),
        median_done: d.get(d.len() / 2).copied().unwrap_or(0.0),
        bytes,
        gbps: bytes as f64 / seconds / 1e9,
        store_bytes: 0,
        store_reads: 0,
        node_bytes: Vec::new(),
        node_max_over_mean: 1.0,
        memory_hits: 0,
        client_fallbacks: 0,
        client_store_bytes: 0,
        store_hedges: 0,
        member_failures: 0,
        silent_gives_up: 0,
        store_errors: 0,
        server_cpu_seconds: 0.0,
        client_cpu_seconds: client_cpu,
    }
}

/// Reads every page of `info` in order with `qd` in flight; checks every `every`th page's crc32
/// (0: none).
async fn read_whole<F, Fut>(
    info: &ObjectInfo,
    page: u64,
    qd: usize,
    every: u64,
    crcs: &[u32],
    read: F,
) -> Result<()>
where
    F: Fn(ObjectInfo, u64) -> Fut,
    Fut: std::future::Future<Output = Result<bytes::Bytes>>,
{
    let pages = info.size.div_ceil(page);
    let mut results = stream::iter(0..pages)
        .map(|p| {
            let fut = read(info.clone(), p);
            async move { (p, fut.await) }
        })
        .buffered(qd.max(1));
    while let Some((p, r)) = results.next().await {
        let b = r?;
        let want = (info.size - p * page).min(page);
        if b.len() as u64 != want {
            bail!("page {p}: {} bytes, {want} expected", b.len());
        }
        if every > 0 && p % every == 0 && crcs.get(p as usize) != Some(&crc32fast::hash(&b)) {
            bail!("page {p}: the bytes differ from the file's");
        }
    }
    Ok(())
}

/// Every shard's counters, by node address. A shard that does not answer (a loaded machine can
/// make a counters request time out) is asked again a few times; counting it as zero would turn
/// the pass's figures into nonsense, so in the end that is an error.
async fn counters(client: &Client) -> Result<Vec<(NodeInfo, ShardCounters)>> {
    let mut missing = Vec::new();
    for attempt in 0..5u32 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
        }
        match all_answered(client.shard_counters().await) {
            Ok(counters) => return Ok(counters),
            Err(m) => missing = m,
        }
    }
    bail!(
        "the counters of {} did not come after 5 tries",
        missing.join(", ")
    )
}

/// The counters of every shard, or the shards that did not answer.
fn all_answered(
    answers: Vec<(NodeInfo, u16, Option<ShardCounters>)>,
) -> std::result::Result<Vec<(NodeInfo, ShardCounters)>, Vec<String>> {
    let missing: Vec<String> = answers
        .iter()
        .filter(|(_, _, c)| c.is_none())
        .map(|(n, shard, _)| format!("{} shard {shard}", n.addr))
        .collect();
    if !missing.is_empty() {
        return Err(missing);
    }
    Ok(answers
        .into_iter()
        .filter_map(|(n, _, c)| c.map(|c| (n, c)))
        .collect())
}

/// `after - before` of a counter, per node (in the membership's order).
fn per_node(
    nodes: &[NodeInfo],
    before: &[(NodeInfo, ShardCounters)],
    after: &[(NodeInfo, ShardCounters)],
    f: fn(&ShardCounters) -> u64,
) -> Vec<u64> {
    let sum = |v: &[(NodeInfo, ShardCounters)], id: u128| {
        v.iter()
            .filter(|(n, _)| n.id == id)
            .map(|(_, c)| f(c))
            .sum::<u64>()
    };
    nodes
        .iter()
        .map(|n| sum(after, n.id).saturating_sub(sum(before, n.id)))
        .collect()
}

fn node_cpu(cluster: &LocalCluster) -> Vec<(std::net::SocketAddr, f64)> {
    cluster
        .nodes
        .iter()
        .filter_map(|n| n.child.as_ref().map(|c| (n.base, proc_cpu(c.id()))))
        .collect()
}

/// The cold and warm fan-out passes for each reader count, the hot-page pass, then (without
/// replicas) the same-shard test.
async fn cluster_passes(
    o: &Opts,
    cluster: &LocalCluster,
    memory: bool,
    replicas: bool,
    readers: &[usize],
    page: u64,
    crcs: &Arc<Vec<u32>>,
) -> Result<(Vec<Pass>, Option<serde_json::Value>)> {
    let setup = (memory, replicas);
    let most = readers.iter().copied().max().unwrap_or(1);
    let mut clients = Vec::new();
    for _ in 0..most.div_ceil(READERS_PER_CLIENT) {
        clients.push(
            cluster
                .client(ClientOptions::default())
                .await
                .map_err(anyhow::Error::msg)?,
        );
    }
    let info = clients[0].stat("/w/weights.bin").await?;
    let nodes: Vec<NodeInfo> = clients[0].membership().nodes().copied().collect();
    let mut out = Vec::new();
    for &n in readers {
        // Cold: nothing of the file cached anywhere (disk or memory).
        clients[0].invalidate(&info.path, Some(info.file_id)).await;
        for warm in [false, true] {
            let name = format!(
                "{} fan-out{}",
                if warm { "warm" } else { "cold" },
                suffix(setup)
            );
            let p = fan_out(
                o, cluster, &clients, &nodes, &info, n, page, crcs, setup, name,
            )
            .await?;
            if !warm {
                cold_accounting(&p, info.size)?;
            }
            say(
                o,
                format!(
                    "{}, {n} readers: all done in {:.2} s ({:.2} GB/s); store read {} bytes in \
                     {} loads; node bytes max/mean {:.2}; memory hits {}{}",
                    p.name,
                    p.seconds,
                    p.gbps,
                    p.store_bytes,
                    p.store_reads,
                    p.node_max_over_mean,
                    p.memory_hits,
                    clients_own_reads(&p)
                ),
            );
            out.push(p);
        }
    }
    let hot = hot_page(o, cluster, &clients, &nodes, &info, most, page, crcs, setup).await?;
    say(
        o,
        format!(
            "{}, {most} readers: {:.2} GB/s; node bytes max/mean {:.2}; {} reads by replicas",
            hot.name, hot.gbps, hot.node_max_over_mean, hot.hot_reads
        ),
    );
    out.push(hot);
    let shard = if replicas {
        None
    } else {
        Some(same_shard(o, cluster, &clients[0], &nodes, &info, page, memory).await?)
    };
    Ok((out, shard))
}

/// ", memory tier, replicas" and the like: what a pass's cluster runs with.
fn suffix((memory, replicas): (bool, bool)) -> String {
    format!(
        "{}{}",
        if memory { ", memory tier" } else { "" },
        if replicas { ", replicas" } else { "" }
    )
}

/// Node-side figures of a pass: store bytes and loads, bytes served per node, memory hits,
/// client fallbacks and hot reads, server CPU.
struct Counted {
    before: Vec<(NodeInfo, ShardCounters)>,
    clients: Vec<StatsSnapshot>,
    server_cpu: Vec<(std::net::SocketAddr, f64)>,
}

/// The sum over `clients` of one counter, less its sum in `before`.
fn client_delta(
    clients: &[Arc<Client>],
    before: &[StatsSnapshot],
    f: fn(&StatsSnapshot) -> u64,
) -> u64 {
    let now: u64 = clients.iter().map(|c| f(&c.stats())).sum();
    now.saturating_sub(before.iter().map(f).sum())
}

impl Counted {
    async fn start(cluster: &LocalCluster, clients: &[Arc<Client>]) -> Result<Counted> {
        Ok(Counted {
            before: counters(&clients[0]).await?,
            clients: clients.iter().map(|c| c.stats()).collect(),
            server_cpu: node_cpu(cluster),
        })
    }

    async fn finish(
        self,
        p: &mut Pass,
        cluster: &LocalCluster,
        clients: &[Arc<Client>],
        nodes: &[NodeInfo],
    ) -> Result<()> {
        let s1 = node_cpu(cluster);
        p.server_cpu_seconds = s1.iter().map(|(_, c)| c).sum::<f64>()
            - self.server_cpu.iter().map(|(_, c)| c).sum::<f64>();
        let after = counters(&clients[0]).await?;
        let before = &self.before;
        p.store_bytes = per_node(nodes, before, &after, |c| c.ufs_bytes)
            .iter()
            .sum();
        p.store_reads = per_node(nodes, before, &after, |c| c.ufs_reads)
            .iter()
            .sum();
        p.node_bytes = per_node(nodes, before, &after, |c| c.served_bytes);
        p.node_max_over_mean = max_over_mean(&p.node_bytes);
        p.memory_hits = per_node(nodes, before, &after, |c| c.memory_hits)
            .iter()
            .sum();
        let d = |f: fn(&StatsSnapshot) -> u64| client_delta(clients, &self.clients, f);
        p.client_fallbacks = d(|s| s.fallbacks);
        p.hot_reads = d(|s| s.hot_reads);
        p.client_store_bytes = d(|s| s.ufs_bytes);
        p.store_hedges = d(|s| s.store_hedges);
        p.member_failures = d(|s| s.member_failures);
        p.silent_gives_up = d(|s| s.silent_gives_up);
        p.store_errors = d(|s| s.store_errors);
        Ok(())
    }
}

/// Every one of `n` readers re-reads page 0 of the file, whole, for `--seconds` after half a
/// second of warming up (the page turns hot): one page everyone wants.
#[allow(clippy::too_many_arguments)]
async fn hot_page(
    o: &Opts,
    cluster: &LocalCluster,
    clients: &[Arc<Client>],
    nodes: &[NodeInfo],
    info: &ObjectInfo,
    n: usize,
    page: u64,
    crcs: &Arc<Vec<u32>>,
    setup: (bool, bool),
) -> Result<Pass> {
    let want = crcs.first().copied().context("an empty file")?;
    let warm_up = Duration::from_millis(500);
    let measure = Duration::from_secs_f64(o.seconds.max(0.2));
    let t0 = Instant::now();
    let counted = Arc::new(tokio::sync::Mutex::new(None::<(Counted, f64)>));
    let mut tasks = Vec::new();
    for r in 0..n {
        let (client, info) = (clients[r / READERS_PER_CLIENT].clone(), info.clone());
        tasks.push(tokio::spawn(async move {
            let mut bytes = 0u64;
            while t0.elapsed() < warm_up + measure {
                let b = client.read_page(&info, 0, 0, page as u32).await?;
                if r == 0 && crc32fast::hash(&b) != want {
                    bail!("page 0: the bytes differ from the file's");
                }
                if t0.elapsed() >= warm_up {
                    bytes += b.len() as u64;
                }
            }
            Ok::<_, anyhow::Error>(bytes)
        }));
    }
    tokio::time::sleep(warm_up).await;
    *counted.lock().await = Some((
        Counted::start(cluster, clients).await?,
        crate::local::cpu_seconds(),
    ));
    let mut bytes = 0;
    for t in tasks {
        bytes += t.await??;
    }
    let secs = (t0.elapsed() - warm_up).as_secs_f64();
    let (c, cpu0) = counted.lock().await.take().context("no start sample")?;
    let mut p = pass(
        format!("hot page{}", suffix(setup)),
        n,
        setup,
        &[secs],
        bytes,
        crate::local::cpu_seconds() - cpu0,
    );
    c.finish(&mut p, cluster, clients, nodes).await?;
    Ok(p)
}

/// All `n` readers (over the clients, [`READERS_PER_CLIENT`] each) read the whole file at once.
#[allow(clippy::too_many_arguments)]
async fn fan_out(
    o: &Opts,
    cluster: &LocalCluster,
    clients: &[Arc<Client>],
    nodes: &[NodeInfo],
    info: &ObjectInfo,
    n: usize,
    page: u64,
    crcs: &Arc<Vec<u32>>,
    setup: (bool, bool),
    name: String,
) -> Result<Pass> {
    let qd = o.reader_qd().max(4);
    let counted = Counted::start(cluster, clients).await?;
    let c0 = crate::local::cpu_seconds();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for r in 0..n {
        let client = clients[r / READERS_PER_CLIENT].clone();
        let (info, crcs) = (info.clone(), crcs.clone());
        let every = if r == 0 { 1 } else { o.verify_every };
        tasks.push(tokio::spawn(async move {
            read_whole(&info, page, qd, every, &crcs, move |info, p| {
                let client = client.clone();
                async move { Ok(client.read_page(&info, p, 0, page as u32).await?) }
            })
            .await
            .map(|()| t0.elapsed().as_secs_f64())
        }));
    }
    let mut done = Vec::new();
    for t in tasks {
        done.push(t.await??);
    }
    let client_cpu = crate::local::cpu_seconds() - c0;
    let mut p = pass(name, n, setup, &done, n as u64 * info.size, client_cpu);
    counted.finish(&mut p, cluster, clients, nodes).await?;
    Ok(p)
}

/// Warm whole-page reads of only the pages one shard owns (the owner of page 0), 8 readers,
/// `--seconds` long: from its disk cache (`memory` off) or its memory tier. Throughput, and the
/// CPU per GB of that shard's node.
async fn same_shard(
    o: &Opts,
    cluster: &LocalCluster,
    client: &Arc<Client>,
    nodes: &[NodeInfo],
    info: &ObjectInfo,
    page: u64,
    memory: bool,
) -> Result<serde_json::Value> {
    let membership = client.membership();
    let ring = membership.ring();
    let owner = ring.owner(info.file_id, 0).context("empty ring")?;
    let pages: Vec<u64> = (0..info.size.div_ceil(page))
        .filter(|p| ring.owner(info.file_id, *p) == Some(owner))
        .collect();
    let node = nodes
        .iter()
        .find(|n| n.id == owner.node)
        .context("owner not in the membership")?;
    let pid = cluster
        .nodes
        .iter()
        .find(|n| n.base == node.addr)
        .and_then(|n| n.child.as_ref())
        .map(|c| c.id())
        .context("owner's process")?;
    let pages = Arc::new(pages);
    let deadline = Duration::from_secs_f64(o.seconds.max(0.2));
    let before = counters(client).await?;
    let cpu0 = proc_cpu(pid);
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for r in 0..8u64 {
        let (client, info, pages) = (client.clone(), info.clone(), pages.clone());
        tasks.push(tokio::spawn(async move {
            let mut bytes = 0u64;
            let mut i = r as usize;
            while t0.elapsed() < deadline {
                let p = pages[i % pages.len()];
                bytes += client.read_page(&info, p, 0, page as u32).await?.len() as u64;
                i += 8;
            }
            Ok::<_, anyhow::Error>(bytes)
        }));
    }
    let mut bytes = 0;
    for t in tasks {
        bytes += t.await??;
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = proc_cpu(pid) - cpu0;
    let after = counters(client).await?;
    let mem_hits: u64 = per_node(nodes, &before, &after, |c| c.memory_hits)
        .iter()
        .sum();
    let disk_hits: u64 = per_node(nodes, &before, &after, |c| c.hits).iter().sum();
    let gb = bytes as f64 / 1e9;
    let v = serde_json::json!({
        "memory_tier": memory, "shard": owner.shard, "pages": pages.len(), "bytes": bytes,
        "seconds": secs, "gbps": gb / secs, "node_cpu_seconds_per_gb": cpu / gb.max(1e-9),
        "memory_hits": mem_hits, "disk_hits": disk_hits,
    });
    say(
        o,
        format!(
            "same shard ({} pages of shard {}), warm from {}: {:.2} GB/s, node CPU {:.2} s/GB \
             ({mem_hits} memory hits, {disk_hits} disk hits)",
            pages.len(),
            owner.shard,
            if memory { "memory" } else { "disk" },
            gb / secs,
            cpu / gb.max(1e-9)
        ),
    );
    Ok(v)
}

fn report_all(
    o: &Opts,
    size: u64,
    direct: &[Pass],
    passes: &[Pass],
    shard: &[serde_json::Value],
    mut report: serde_json::Map<String, serde_json::Value>,
) -> Result<()> {
    let mut ratios = Vec::new();
    for d in direct {
        for p in passes.iter().filter(|p| p.readers == d.readers) {
            ratios.push(serde_json::json!({
                "readers": d.readers, "pass": p.name,
                "direct_over_cluster_completion": d.seconds / p.seconds,
            }));
        }
    }
    let mem_over_disk = match (
        shard.first().and_then(|s| s["gbps"].as_f64()),
        shard.get(1).and_then(|s| s["gbps"].as_f64()),
    ) {
        (Some(disk), Some(mem)) if disk > 0.0 => mem / disk,
        _ => f64::NAN,
    };
    if o.json {
        let json = |v: &[Pass]| v.iter().map(Pass::to_json).collect::<Vec<_>>();
        report.insert("direct".into(), json(direct).into());
        report.insert("passes".into(), json(passes).into());
        report.insert("completion_ratios".into(), ratios.into());
        report.insert("same_shard".into(), shard.to_vec().into());
        report.insert("memory_over_disk_same_shard".into(), mem_over_disk.into());
        println!("{}", serde_json::Value::Object(report));
        return Ok(());
    }
    println!(
        "\n{:<36} {:>7} {:>9} {:>8} {:>12} {:>12} {:>9} {:>10} {:>10}",
        "pass",
        "readers",
        "all done",
        "GB/s",
        "direct/this",
        "store bytes",
        "node max",
        "server s",
        "client s"
    );
    for p in direct.iter().chain(passes) {
        let d = direct.iter().find(|d| d.readers == p.readers);
        println!(
            "{:<36} {:>7} {:>8.2}s {:>8.2} {:>11.2}x {:>12} {:>8.2}x {:>10.1} {:>10.1}",
            p.name,
            p.readers,
            p.seconds,
            p.gbps,
            d.map_or(f64::NAN, |d| d.seconds / p.seconds),
            if p.node_bytes.is_empty() {
                "-".to_string()
            } else {
                p.store_bytes.to_string()
            },
            p.node_max_over_mean,
            p.server_cpu_seconds,
            p.client_cpu_seconds
        );
    }
    let cold: Vec<&Pass> = passes
        .iter()
        .filter(|p| p.name.starts_with("cold"))
        .collect();
    let by_clients: u64 = cold.iter().map(|p| p.client_store_bytes).sum();
    let once = cold
        .iter()
        .filter(|p| p.store_bytes == size && p.client_store_bytes == 0)
        .count();
    println!(
        "{once} of {} cold fan-outs read the store for exactly the file's {size} bytes, all \
         by the nodes{}; memory over disk hits for the same shard: {mem_over_disk:.2}x",
        cold.len(),
        if by_clients > 0 {
            format!(
                "; in the others the clients also read {by_clients} bytes from the store \
                 themselves, after fallbacks or hedges"
            )
        } else {
            String::new()
        }
    );
    Ok(())
}

/// Checks a cold pass's store reads: the nodes read each page at most once, and what they did
/// not read, the clients read themselves (a fallback from a member judged dead, a hedge to the
/// store). Anything else means the cache was not cold, or a page was fetched twice.
fn cold_accounting(p: &Pass, size: u64) -> Result<()> {
    if p.store_bytes > size {
        bail!(
            "{}: the nodes read the store for {} bytes, more than the file's {size}: a page was \
             fetched twice",
            p.name,
            p.store_bytes
        );
    }
    if p.store_bytes + p.client_store_bytes < size {
        bail!(
            "{}: the nodes read {} bytes and the clients {} from the store, less than the \
             file's {size}: the cache was not cold",
            p.name,
            p.store_bytes,
            p.client_store_bytes
        );
    }
    Ok(())
}

/// What the clients read from the store themselves during a pass, for its line.
fn clients_own_reads(p: &Pass) -> String {
    if p.client_store_bytes == 0 && p.client_fallbacks == 0 && p.member_failures == 0 {
        return String::new();
    }
    format!(
        "; clients read {} bytes from the store themselves ({} fallbacks, {} hedges to the \
         store; {} member failures, {} of them silent, {} store errors)",
        p.client_store_bytes,
        p.client_fallbacks,
        p.store_hedges,
        p.member_failures,
        p.silent_gives_up,
        p.store_errors,
    )
}

/// Prints a line of the human report (nothing with `--json`).
fn say(o: &Opts, line: String) {
    if !o.json {
        println!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_count_only_when_every_shard_answered() {
        let node = |id: u128, port: u16| NodeInfo {
            id,
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            shards: 2,
        };
        let some = |ufs_bytes| {
            Some(ShardCounters {
                ufs_bytes,
                ..ShardCounters::default()
            })
        };
        let all = vec![(node(1, 7400), 0, some(5)), (node(2, 7410), 1, some(7))];
        let got = all_answered(all).map_err(|m| m.join(", "));
        let bytes: Vec<u64> = got
            .as_ref()
            .map_or(vec![], |v| v.iter().map(|(_, c)| c.ufs_bytes).collect());
        assert_eq!(bytes, vec![5, 7], "{got:?}");
        let partial = vec![(node(1, 7400), 0, some(5)), (node(2, 7410), 1, None)];
        assert_eq!(
            all_answered(partial).map(|v| v.len()),
            Err(vec!["127.0.0.1:7410 shard 1".to_string()])
        );
    }
}
