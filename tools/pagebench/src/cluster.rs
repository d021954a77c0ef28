//! The `cluster` target: reads through the client library from `--nodes` (default 3) real
//! `pagestored` processes on loopback, over a local-directory under storage, against references measured in the same run:
//!
//! - **ufs**: the same pages read straight from the under storage with object_store (the
//!   no-cache baseline; the cold pass should reach at least 0.9x of it);
//! - **cold**: every page once through the cluster (each a miss: the owner loads it);
//! - **warm**: every page again (each a hit);
//! - **local**: the engine alone reading 4 MiB pages in-process (the ceiling for warm reads);
//! - **kill**: a long warm scan during which the last node is SIGKILLed: throughput before,
//!   during and after, and how long until the first read falls back (with one node, every read
//!   after the kill is a fallback).
//!
//! Each pass checks that it read the same bytes as the baseline (a crc32 per page).

use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use futures_util::{stream, StreamExt};
use pagestore_client::{
    ufs::{MountTable, ObjectInfo},
    Client, ClientOptions,
};
use pagestore_testkit::{
    data::{Xorshift, GOLDEN},
    local_cluster::{LocalCluster, Settings},
};

use crate::{bench::proc_cpu, Opts};

type Report = serde_json::Map<String, serde_json::Value>;

/// One measured pass.
struct Pass {
    name: &'static str,
    bytes: u64,
    secs: f64,
    client_cpu: f64,
    server_cpu: f64,
}

impl Pass {
    fn gbps(&self) -> f64 {
        self.bytes as f64 / self.secs / 1e9
    }
}

fn pagestored_binary() -> Result<PathBuf> {
    crate::frontends::tool_binary("pagestored")
}

fn cluster_cpu(c: &LocalCluster) -> f64 {
    c.nodes
        .iter()
        .filter_map(|n| n.child.as_ref())
        .map(|ch| proc_cpu(ch.id()))
        .sum()
}

/// Writes `files` files of `file_size` bytes under `dir` (kept between runs of the same shape).
fn dataset(dir: &Path, files: u64, file_size: u64, seed: u64) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    let mut buf = vec![0u8; 1 << 20];
    for f in 0..files {
        let path = dir.join(format!("f{f:05}"));
        if std::fs::metadata(&path).is_ok_and(|m| m.len() == file_size) {
            continue;
        }
        // The testkit's generator: the same stream as ever, so kept datasets stay valid.
        let mut x = Xorshift::new(seed.wrapping_mul(GOLDEN) ^ (f + 1));
        let mut out = std::fs::File::create(&path)?;
        let mut left = file_size as usize;
        while left > 0 {
            let n = left.min(buf.len());
            x.fill(&mut buf[..n]);
            std::io::Write::write_all(&mut out, &buf[..n])?;
            left -= n;
        }
    }
    Ok(())
}

/// Reads every page of `infos` with `qd` pages in flight through `read`, returning the bytes
/// and a crc32 per page in (file, page) order.
async fn read_pages<F, Fut>(
    infos: &[ObjectInfo],
    page: u64,
    qd: usize,
    read: F,
) -> Result<(u64, Vec<u32>)>
where
    F: Fn(ObjectInfo, u64) -> Fut,
    Fut: std::future::Future<Output = Result<bytes::Bytes>>,
{
    let work: Vec<(usize, u64)> = infos
        .iter()
        .enumerate()
        .flat_map(|(i, info)| (0..info.size.div_ceil(page)).map(move |p| (i, p)))
        .collect();
    let mut crcs = vec![0u32; work.len()];
    let mut total = 0u64;
    let mut results = stream::iter(work.iter().enumerate())
        .map(|(slot, &(i, p))| {
            let fut = read(infos[i].clone(), p);
            async move { (slot, fut.await) }
        })
        .buffer_unordered(qd.max(1));
    while let Some((slot, r)) = results.next().await {
        let b = r?;
        total += b.len() as u64;
        crcs[slot] = crc32fast::hash(&b);
    }
    Ok((total, crcs))
}

/// Runs the whole comparison.
pub fn run_cluster(o: &Opts) -> Result<()> {
    let binary = pagestored_binary()?;
    let root = o.dir.join("cluster");
    let ufs_dir = root.join("ufs");
    let page = u64::from(o.page_size);
    let file_size = (64 << 20).max(page);
    let files = (o.size / file_size).max(1);
    dataset(&ufs_dir, files, file_size, o.seed)?;
    let nodes_dir = root.join("nodes");
    let _ = std::fs::remove_dir_all(&nodes_dir);
    let mut emulate = Vec::new();
    if let Some(ms) = o.ufs_latency_ms {
        emulate.push(format!("emulate_latency_ms={ms}"));
    }
    if let Some(m) = o.ufs_mbps {
        emulate.push(format!("emulate_mbps={m}"));
    }
    let query = if emulate.is_empty() {
        String::new()
    } else {
        format!("?{}", emulate.join("&"))
    };
    let mount = format!("/bench=file://{}{query}", ufs_dir.display());
    let mut settings = Settings::new(&binary, &nodes_dir);
    settings.nodes = nodes(o);
    settings.shards = o.shards as u16;
    settings.page_size = o.page_size.to_string();
    settings.cache_size = (o.size * 2 / 3 + (256 << 20)).to_string();
    settings.mounts = vec![mount.clone()];
    settings.metadata_ttl = "600".into();
    // Reads go to the pages' owners (warm means all hits, and the kill timeline is about the
    // owner path); `fanout` measures hot-page replicas.
    settings.extra = vec!["--hot-replicas".into(), "1".into()];
    let mut cluster = LocalCluster::start(settings).map_err(anyhow::Error::msg)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut report = Report::new();
    let warm = rt.block_on(async { measure(o, &mut cluster, &mount, files, &mut report).await });
    drop(cluster);
    let _ = std::fs::remove_dir_all(&nodes_dir);
    let warm = warm?;
    // The ceiling: the engine alone, in this process, reading whole pages (same page size, same
    // pages in flight per shard).
    let local = crate::local::run_local(&Opts {
        workloads: vec!["read".into()],
        size: o.size.min(2 << 30),
        seconds: o.seconds.min(5.0),
        ..o.clone()
    })?;
    let ceiling = local.first().map_or(f64::NAN, |r| r.bw() / 1e9);
    if o.json {
        report.insert("local_ceiling_gbps".into(), ceiling.into());
        report.insert("warm_over_local".into(), (warm / ceiling).into());
        report.insert("mode".into(), "cluster".into());
        println!("{}", serde_json::Value::Object(report));
        return Ok(());
    }
    println!(
        "\nlocal engine ceiling (engine alone, {} shard(s), whole-page reads): {ceiling:.2} GB/s; \
         warm cluster / local = {:.2}x",
        o.shards,
        warm / ceiling
    );
    Ok(())
}

/// The cluster's nodes.
fn nodes(o: &Opts) -> usize {
    o.nodes.unwrap_or(3)
}

/// Runs the passes and the kill timeline; returns the warm pass's GB/s.
async fn measure(
    o: &Opts,
    cluster: &mut LocalCluster,
    mount: &str,
    files: u64,
    report: &mut Report,
) -> Result<f64> {
    let page = u64::from(o.page_size);
    let (prefix, url) = mount.split_once('=').context("bad mount")?;
    let ufs = Arc::new(MountTable::new(&[(prefix.to_string(), url.to_string())])?);
    let client = cluster
        .client(ClientOptions {
            parallel: o.qd,
            ..ClientOptions::default()
        })
        .await
        .map_err(anyhow::Error::msg)?;
    let mut infos = Vec::new();
    for f in 0..files {
        let path = format!("/bench/f{f:05}");
        infos.push(client.stat(&path).await?);
    }
    let total_bytes: u64 = infos.iter().map(|i| i.size).sum();
    report.insert(
        "setup".into(),
        serde_json::json!({"nodes": nodes(o), "shards": o.shards, "files": files,
            "bytes": total_bytes, "page_size": page, "in_flight": o.qd,
            "under_storage": pagestore_client::ufs::redact(url)}),
    );
    say(
        o,
        format!(
            "cluster: {} node(s) x {} shard(s), {} files, {:.2} GB, page {} KiB, {} pages in \
             flight; under storage {}",
            nodes(o),
            o.shards,
            files,
            total_bytes as f64 / 1e9,
            page >> 10,
            o.qd,
            pagestore_client::ufs::redact(url)
        ),
    );

    let (passes, reference, (hits, misses)) = run_passes(o, cluster, &ufs, &client, &infos).await?;
    let pages: u64 = infos.iter().map(|i| i.size.div_ceil(page)).sum();
    report_passes(
        o,
        &passes,
        hits,
        misses,
        pages,
        client.stats().fallbacks,
        report,
    );

    let mut random = Vec::new();
    for block in [4096u64, 128 << 10] {
        random.push(random_reads(o, &client, &infos, block).await?);
    }
    report.insert("random".into(), random.into());
    let kill = kill_timeline(o, cluster, &client, &infos, &reference).await?;
    report.insert("kill".into(), kill);
    Ok(passes[2].gbps())
}

/// The three passes over every page: the under storage with no cache, then cold and warm
/// through the client. Returns them, the under storage's crc32 per page, and the (hits,
/// misses) the nodes counted over the cold and warm passes.
async fn run_passes(
    o: &Opts,
    cluster: &mut LocalCluster,
    ufs: &Arc<MountTable>,
    client: &Arc<Client>,
    infos: &[ObjectInfo],
) -> Result<(Vec<Pass>, Vec<u32>, (u64, u64))> {
    let page = u64::from(o.page_size);
    let mut passes = Vec::new();
    // The no-cache baseline: object_store straight from the under storage.
    let (c0, s0, t0) = (
        crate::local::cpu_seconds(),
        cluster_cpu(cluster),
        Instant::now(),
    );
    let (bytes, reference) = read_pages(infos, page, o.qd, |info, p| {
        let ufs = ufs.clone();
        async move {
            let start = p * page;
            Ok(ufs
                .read(&info, start..(start + page).min(info.size))
                .await?)
        }
    })
    .await?;
    passes.push(Pass {
        name: "ufs (object_store, no cache)",
        bytes,
        secs: t0.elapsed().as_secs_f64(),
        client_cpu: crate::local::cpu_seconds() - c0,
        server_cpu: cluster_cpu(cluster) - s0,
    });
    let (h0, m0) = cluster
        .hits_and_misses()
        .await
        .map_err(anyhow::Error::msg)?;
    for name in ["cold (miss: owner loads)", "warm (hit)"] {
        let (c0, s0, t0) = (
            crate::local::cpu_seconds(),
            cluster_cpu(cluster),
            Instant::now(),
        );
        let (bytes, crcs) = read_pages(infos, page, o.qd, |info, p| {
            let client = client.clone();
            async move { Ok(client.read_page(&info, p, 0, page as u32).await?) }
        })
        .await?;
        if crcs != reference {
            bail!("{name}: the bytes differ from the under storage's");
        }
        passes.push(Pass {
            name,
            bytes,
            secs: t0.elapsed().as_secs_f64(),
            client_cpu: crate::local::cpu_seconds() - c0,
            server_cpu: cluster_cpu(cluster) - s0,
        });
    }
    let (h1, m1) = cluster
        .hits_and_misses()
        .await
        .map_err(anyhow::Error::msg)?;
    Ok((passes, reference, (h1 - h0, m1 - m0)))
}

/// Prints the passes and adds them, and the counters, to the report.
fn report_passes(
    o: &Opts,
    passes: &[Pass],
    hits: u64,
    misses: u64,
    pages: u64,
    fallbacks: u64,
    report: &mut Report,
) {
    say(
        o,
        format!(
            "\n{:<30} {:>8} {:>10} {:>14} {:>14}",
            "pass", "GB/s", "vs ufs", "client CPU s/GB", "server CPU s/GB"
        ),
    );
    let base = passes[0].gbps();
    let mut pass_json = Vec::new();
    for p in passes {
        let gb = p.bytes as f64 / 1e9;
        say(
            o,
            format!(
                "{:<30} {:>8.2} {:>9.2}x {:>14.2} {:>14.2}",
                p.name,
                p.gbps(),
                p.gbps() / base,
                p.client_cpu / gb,
                p.server_cpu / gb
            ),
        );
        pass_json.push(serde_json::json!({
            "pass": p.name, "bytes": p.bytes, "seconds": p.secs, "gbps": p.gbps(),
            "vs_ufs": p.gbps() / base, "client_cpu_seconds_per_gb": p.client_cpu / gb,
            "server_cpu_seconds_per_gb": p.server_cpu / gb,
        }));
    }
    report.insert("passes".into(), pass_json.into());
    report.insert(
        "counters".into(),
        serde_json::json!({"hits": hits, "misses": misses, "pages_per_pass": pages,
            "fallbacks": fallbacks}),
    );
    report.insert("cold_over_ufs".into(), (passes[1].gbps() / base).into());
    report.insert(
        "warm_over_cold".into(),
        (passes[2].gbps() / passes[1].gbps()).into(),
    );
    say(
        o,
        format!(
            "hits {} / misses {} over the two passes ({} pages each); fallbacks {}",
            hits, misses, pages, fallbacks
        ),
    );
    say(
        o,
        format!(
            "cold / ufs = {:.2}x (target >= 0.9x); warm / cold = {:.2}x",
            passes[1].gbps() / base,
            passes[2].gbps() / passes[1].gbps()
        ),
    );
}

/// Warm random reads of `block` bytes at uniformly random offsets of random files, `qd` in
/// flight, for `o.seconds`: IOPS and latency through the client library.
async fn random_reads(
    o: &Opts,
    client: &Arc<Client>,
    infos: &[ObjectInfo],
    block: u64,
) -> Result<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs_f64(o.seconds);
    let ops = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..o.qd.max(1) as u64 {
        let (client, infos, ops) = (client.clone(), infos.to_vec(), ops.clone());
        let mut x = o.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (w + 1);
        tasks.push(tokio::spawn(async move {
            let mut hist = crate::local::new_hist();
            while Instant::now() < deadline {
                crate::local::rng_next(&mut x);
                let info = &infos[(x % infos.len() as u64) as usize];
                let off = ((x >> 20) % (info.size.saturating_sub(block) / block).max(1)) * block;
                let t = Instant::now();
                let b = client.read_at(info, off, block).await?;
                if b.len() as u64 != block.min(info.size - off) {
                    bail!("short read at {off} of {}", info.path);
                }
                hist.saturating_record(t.elapsed().as_nanos() as u64);
                ops.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, anyhow::Error>(hist)
        }));
    }
    let start = Instant::now();
    let mut hist = crate::local::new_hist();
    for t in tasks {
        let h = t.await??;
        hist.add(&h)?;
    }
    let secs = start.elapsed().as_secs_f64().max(o.seconds);
    let n = ops.load(Ordering::Relaxed);
    let q = |v: f64| hist.value_at_quantile(v) as f64 / 1e3;
    say(
        o,
        format!(
            "warm random {} KiB reads through the client: {:.0} IOPS, {:.1} MB/s, p50 {:.0} us, \
             p99 {:.0} us ({} in flight)",
            block >> 10,
            n as f64 / secs,
            (n * block) as f64 / secs / 1e6,
            q(0.5),
            q(0.99),
            o.qd
        ),
    );
    Ok(serde_json::json!({
        "block": block, "ops": n, "seconds": secs, "iops": n as f64 / secs,
        "bytes_per_sec": (n * block) as f64 / secs, "in_flight": o.qd,
        "latency_us": {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "p99.9": q(0.999),
            "max": hist.max() as f64 / 1e3},
    }))
}

/// Prints a line of the human report (nothing with `--json`).
fn say(o: &Opts, line: String) {
    if !o.json {
        println!("{line}");
    }
}

/// A warm scan of everything, one file at a time through file handles (read-ahead), with the
/// last node SIGKILLed a third of the way through.
async fn kill_timeline(
    o: &Opts,
    cluster: &mut LocalCluster,
    client: &Arc<Client>,
    infos: &[ObjectInfo],
    reference: &[u32],
) -> Result<serde_json::Value> {
    use tokio::io::AsyncReadExt;
    let page = u64::from(o.page_size) as usize;
    let total: u64 = infos.iter().map(|i| i.size).sum();
    let done = Arc::new(AtomicU64::new(0));
    let st0 = client.stats();
    let start = Instant::now();
    let sampler = spawn_sampler(client, &done, start, total);
    let mut killed_at = None;
    let mut slot = 0;
    let mut buf = vec![0u8; page];
    for info in infos {
        let mut f = client.open(&info.path).await?;
        loop {
            let mut got = 0;
            while got < page {
                let n = f.read(&mut buf[got..]).await?;
                if n == 0 {
                    break;
                }
                got += n;
            }
            if got == 0 {
                break;
            }
            if crc32fast::hash(&buf[..got]) != reference[slot] {
                bail!("{}: page bytes differ during the kill run", info.path);
            }
            slot += 1;
            let d = done.fetch_add(got as u64, Ordering::Relaxed) + got as u64;
            if killed_at.is_none() && d >= total / 3 {
                cluster.kill(nodes(o) - 1);
                killed_at = Some(start.elapsed().as_secs_f64());
            }
        }
    }
    let end = start.elapsed().as_secs_f64();
    let samples = sampler.await?;
    let kill = killed_at.context("the scan ended before the kill")?;
    Ok(kill_report(o, client, &st0, &samples, total, kill, end))
}

/// One sample of the kill run.
#[derive(Clone, Copy)]
struct Sample {
    /// Seconds since the start.
    at: f64,
    /// Bytes read so far.
    done: u64,
    /// The client's fallbacks (reads from the under storage, hedges that won included).
    fallbacks: u64,
    /// The client's hedges sent.
    hedges: u64,
}

/// Samples the kill run every 20 ms until `done` reaches `total`.
fn spawn_sampler(
    client: &Arc<Client>,
    done: &Arc<AtomicU64>,
    start: Instant,
    total: u64,
) -> tokio::task::JoinHandle<Vec<Sample>> {
    let done = done.clone();
    let client = client.clone();
    tokio::spawn(async move {
        let mut samples = Vec::new();
        loop {
            let st = client.stats();
            samples.push(Sample {
                at: start.elapsed().as_secs_f64(),
                done: done.load(Ordering::Relaxed),
                fallbacks: st.fallbacks,
                hedges: st.hedges,
            });
            if done.load(Ordering::Relaxed) >= total {
                return samples;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

/// Prints the kill run's timeline and returns it as JSON.
fn kill_report(
    o: &Opts,
    client: &Arc<Client>,
    st0: &pagestore_client::StatsSnapshot,
    samples: &[Sample],
    total: u64,
    kill: f64,
    end: f64,
) -> serde_json::Value {
    let (fb0, h0) = samples
        .iter()
        .take_while(|s| s.at <= kill)
        .last()
        .map_or((0, 0), |s| (s.fallbacks, s.hedges));
    let detect = samples
        .iter()
        .find(|s| s.fallbacks > fb0)
        .map(|s| s.at - kill);
    let first_hedge = samples.iter().find(|s| s.hedges > h0).map(|s| s.at - kill);
    let bytes_at = |t: f64| {
        samples
            .iter()
            .take_while(|s| s.at <= t)
            .last()
            .map_or(0, |s| s.done)
    };
    let rate = |a: f64, b: f64| (bytes_at(b) - bytes_at(a)) as f64 / (b - a).max(1e-9) / 1e9;
    let during_end = (kill + 5.0).min(end);
    let after = (end > during_end).then(|| rate(during_end, end));
    let st = client.stats();
    say(
        o,
        format!(
            "\nkill run: {:.2} GB warm scan through file handles, node {} SIGKILLed at {kill:.2} s",
            total as f64 / 1e9,
            nodes(o) - 1
        ),
    );
    say(
        o,
        format!(
            "  before {:.2} GB/s | first {:.1} s after {:.2} GB/s | after that {:.2} GB/s \
             (first 5 s / after = {:.2}x) | first fallback {} after the kill (first hedge {}) | {} \
             fallbacks, {} member failures, {} skipped while dead",
            rate(0.0, kill),
            during_end - kill,
            rate(kill, during_end),
            after.unwrap_or(f64::NAN),
            after.map_or(f64::NAN, |a| rate(kill, during_end) / a),
            detect.map_or("never".into(), |d| format!("{d:.2} s")),
            first_hedge.map_or("none".into(), |d| format!("{d:.2} s")),
            st.fallbacks,
            st.member_failures,
            st.skipped_dead
        ),
    );
    say(
        o,
        format!(
            "  during the scan: hedges {} sent ({} to the store), {} won, {} refused by the \
             budget; {} requests given up by the silence rule, {} members found gone (their \
             port refused) (earlier passes: {} hedges, {} won)",
            st.hedges - st0.hedges,
            st.store_hedges - st0.store_hedges,
            st.hedges_won - st0.hedges_won,
            st.hedges_refused - st0.hedges_refused,
            st.silent_gives_up - st0.silent_gives_up,
            st.ports_refused - st0.ports_refused,
            st0.hedges,
            st0.hedges_won
        ),
    );
    say(
        o,
        "  every page read byte-exact (crc32 against the under storage's)".into(),
    );
    serde_json::json!({
        "bytes": total, "killed_at_secs": kill, "end_secs": end,
        "before_gbps": rate(0.0, kill), "during_secs": during_end - kill,
        "during_gbps": rate(kill, during_end), "after_gbps": after,
        "first_fallback_after_kill_secs": detect, "first_hedge_after_kill_secs": first_hedge,
        "fallbacks": st.fallbacks, "hedges": st.hedges - st0.hedges,
        "store_hedges": st.store_hedges - st0.store_hedges,
        "hedges_won": st.hedges_won - st0.hedges_won,
        "hedges_refused": st.hedges_refused - st0.hedges_refused,
        "silent_gives_up": st.silent_gives_up - st0.silent_gives_up,
        "ports_refused": st.ports_refused - st0.ports_refused,
        "hedges_before_scan": st0.hedges,
        "member_failures": st.member_failures, "skipped_dead": st.skipped_dead,
        "byte_exact": true,
    })
}
