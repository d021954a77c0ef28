//! The `local` target: the engine driven directly on its shard executors (no network), and the
//! `restart` measurement.

use std::{collections::HashMap, rc::Rc, time::Instant};

use anyhow::{anyhow, bail, Result};
use hdrhistogram::Histogram;
use pagestore_engine::{format::Geometry, Engine, EngineConfig, PageKey, ShardStats};
use pagestore_testkit::data::{Xorshift, GOLDEN};

use crate::{
    fio::{FioBest, Variant},
    uring, Opts,
};

/// One workload's outcome.
pub struct WorkloadResult {
    /// Workload name.
    pub name: String,
    /// Bytes moved.
    pub bytes: u64,
    /// Operations completed.
    pub ops: u64,
    /// Wall seconds.
    pub secs: f64,
    /// Latency per operation, nanoseconds.
    pub hist: Histogram<u64>,
    /// CPU seconds (user + system) of the whole process during the workload.
    pub cpu_secs: f64,
    /// Hits / (hits + misses) during the workload, for reads.
    pub hit_ratio: Option<f64>,
    /// Pages the engine evicted to make room during the workload.
    pub evictions: u64,
}

impl WorkloadResult {
    /// `ops` reads of `block` bytes outside the engine (no hits to count, nothing evicted),
    /// started at `start` with the process's CPU at `cpu0`.
    fn reads(
        name: String,
        ops: u64,
        block: u64,
        start: Instant,
        cpu0: f64,
        hist: Histogram<u64>,
    ) -> WorkloadResult {
        WorkloadResult {
            name,
            bytes: ops * block,
            ops,
            secs: start.elapsed().as_secs_f64(),
            hist,
            cpu_secs: cpu_seconds() - cpu0,
            hit_ratio: None,
            evictions: 0,
        }
    }
    /// Bytes per second.
    pub fn bw(&self) -> f64 {
        self.bytes as f64 / self.secs
    }
    /// Operations per second.
    pub fn iops(&self) -> f64 {
        self.ops as f64 / self.secs
    }
}

/// User + system CPU seconds of this process so far.
pub fn cpu_seconds() -> f64 {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer for the call.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(r.ru_utime) + tv(r.ru_stime)
}

/// One xorshift64 step: the harness's deterministic pseudo-random source.
pub(crate) fn rng_next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// A latency histogram in nanoseconds (1 µs to 60 s, 3 significant digits).
pub(crate) fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1_000, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// The engine configuration for a benchmark over `o`.
pub fn engine_config(o: &Opts, pages_per_shard: u64) -> EngineConfig {
    let file = Geometry::new(o.page_size, 4096, pages_per_shard as u32).file_size;
    EngineConfig {
        cache_dirs: vec![o.dir.join("engine")],
        capacity: file * o.shards as u64,
        page_size: o.page_size,
        shards: o.shards,
        queue_depth: o.qd,
        reformat: true,
        pin_cpus: o.pin,
        ..Default::default()
    }
}

/// Operations, bytes and latencies measured on one shard.
type Measured = (u64, u64, Histogram<u64>);

#[derive(Clone, Copy)]
enum Kind {
    /// Puts `pages` pages per shard, keys `gen * pages ..` (a new generation evicts the last).
    Write { gen: u64 },
    /// Random reads of `block` bytes of the pages of generation `gen`.
    Read { block: u32, gen: u64 },
}

/// Runs `qd` tasks on every shard at once and merges what they measured.
fn drive(
    engine: &Engine,
    o: &Opts,
    pages: u64,
    kind: Kind,
) -> Result<(u64, u64, Histogram<u64>, f64)> {
    let start = Instant::now();
    let secs = o.seconds;
    let qd = o.qd;
    let page = o.page_size;
    let seed = o.seed;
    let results: Vec<Result<Measured>> = std::thread::scope(|scope| {
        let joins: Vec<_> = engine
            .shards()
            .iter()
            .map(|h| {
                let h = h.clone();
                scope.spawn(move || {
                    futures_lite::future::block_on(h.run(move |shard| async move {
                        let id = shard.id() as u128;
                        let mut data = vec![0u8; page as usize];
                        Xorshift::new(seed ^ (id as u64 + 1).wrapping_mul(GOLDEN)).fill(&mut data);
                        let data = Rc::new(data);
                        let deadline = Instant::now() + std::time::Duration::from_secs_f64(secs);
                        let mut tasks = Vec::new();
                        for t in 0..qd as u64 {
                            let shard = shard.clone();
                            let data = data.clone();
                            tasks.push(glommio::spawn_local(async move {
                                let mut hist = new_hist();
                                let (mut ops, mut bytes) = (0u64, 0u64);
                                let mut x =
                                    seed ^ (t + 1).wrapping_mul(0xC2B2_AE3D_27D4_EB4F) ^ id as u64;
                                match kind {
                                    Kind::Write { gen } => {
                                        let mut i = t;
                                        while i < pages {
                                            let t0 = Instant::now();
                                            let key = PageKey::new(id, gen * pages + i);
                                            shard.put(&key, &data, 1).await?;
                                            let _ = hist.record(t0.elapsed().as_nanos() as u64);
                                            ops += 1;
                                            bytes += data.len() as u64;
                                            i += qd as u64;
                                        }
                                    }
                                    Kind::Read { block, gen } => {
                                        let per_page = (page / block).max(1) as u64;
                                        while Instant::now() < deadline {
                                            let r = rng_next(&mut x);
                                            let p = gen * pages + r % pages;
                                            let off = ((r >> 32) % per_page) as u32 * block;
                                            let t0 = Instant::now();
                                            let got = shard
                                                .get(&PageKey::new(id, p), off, block)
                                                .await?
                                                .ok_or_else(|| anyhow!("page {p} missing"))?;
                                            let _ = hist.record(t0.elapsed().as_nanos() as u64);
                                            ops += 1;
                                            bytes += got.len() as u64;
                                        }
                                    }
                                }
                                Ok::<_, anyhow::Error>((ops, bytes, hist))
                            }));
                        }
                        let mut total = (0, 0, new_hist());
                        for t in tasks {
                            let (ops, bytes, hist) = t.await?;
                            total.0 += ops;
                            total.1 += bytes;
                            total.2.add(hist)?;
                        }
                        Ok(total)
                    }))?
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| {
                j.join()
                    .unwrap_or_else(|_| Err(anyhow!("shard driver panicked")))
            })
            .collect()
    });
    let elapsed = start.elapsed().as_secs_f64();
    let mut out = (0, 0, new_hist(), elapsed);
    for r in results {
        let (ops, bytes, hist) = r?;
        out.0 += ops;
        out.1 += bytes;
        out.2.add(hist)?;
    }
    Ok(out)
}

fn totals(engine: &Engine) -> Result<ShardStats> {
    let s = futures_lite::future::block_on(engine.stats())?;
    Ok(ShardStats::total(&s))
}

/// Runs the selected workloads on a fresh engine.
///
/// `write` inserts every page once (`--size` in all); `write-full` inserts as many new pages
/// into the full cache (filled first if nothing was written yet), so that every insert
/// evicts one; `read` and `read4k` read the pages written last.
pub fn run_local(o: &Opts) -> Result<Vec<WorkloadResult>> {
    let pages = (o.size / o.shards as u64 / o.page_size as u64).max(1);
    // Always a fresh cache: a warm one would turn the write workload into no-ops.
    let _ = std::fs::remove_dir_all(o.dir.join("engine"));
    std::fs::create_dir_all(o.dir.join("engine"))?;
    let engine = Engine::start(engine_config(o, pages))?;
    let mut results = Vec::new();
    // The generation of keys written last (None: nothing written yet).
    let mut gen: Option<u64> = None;
    // The generation written last, after filling the cache with generation 0 if need be.
    let filled = |gen: &mut Option<u64>| -> Result<u64> {
        if gen.is_none() {
            drive(&engine, o, pages, Kind::Write { gen: 0 })?;
        }
        Ok(*gen.get_or_insert(0))
    };
    for w in &o.workloads {
        let kind = match w.as_str() {
            "write" => Kind::Write { gen: 0 },
            "write-full" => {
                let last = filled(&mut gen)?;
                // Every slot must hold a page, or the first inserts would not evict.
                let st = totals(&engine)?;
                if st.pages < st.slots {
                    bail!(
                        "write-full: the cache holds {} pages in {} slots after the fill, so \
                         not every insert would evict",
                        st.pages,
                        st.slots
                    );
                }
                Kind::Write { gen: last + 1 }
            }
            "read" => Kind::Read {
                block: o.page_size,
                gen: filled(&mut gen)?,
            },
            _ => Kind::Read {
                block: 4096,
                gen: filled(&mut gen)?,
            },
        };
        let before = totals(&engine)?;
        let cpu0 = cpu_seconds();
        let (ops, bytes, hist, secs) = drive(&engine, o, pages, kind)?;
        let cpu = cpu_seconds() - cpu0;
        let after = totals(&engine)?;
        if let Kind::Write { gen: g } = kind {
            gen = Some(g);
        }
        let lookups = (after.hits + after.misses) - (before.hits + before.misses);
        results.push(WorkloadResult {
            name: w.clone(),
            bytes,
            ops,
            secs,
            hist,
            cpu_secs: cpu,
            hit_ratio: (lookups > 0).then(|| (after.hits - before.hits) as f64 / lookups as f64),
            evictions: after.evictions - before.evictions,
        });
        if after.checksum_failures != 0 || after.io_errors != 0 {
            bail!(
                "{} checksum failures, {} I/O errors",
                after.checksum_failures,
                after.io_errors
            );
        }
    }
    engine.shutdown()?;
    Ok(results)
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// JSON for one result.
pub fn to_json(r: &WorkloadResult) -> serde_json::Value {
    serde_json::json!({
        "workload": r.name,
        "bytes": r.bytes,
        "ops": r.ops,
        "seconds": r.secs,
        "bytes_per_sec": r.bw(),
        "iops": r.iops(),
        "latency_us": {
            "p50": us(&r.hist, 0.5), "p90": us(&r.hist, 0.9), "p99": us(&r.hist, 0.99),
            "p99.9": us(&r.hist, 0.999), "max": r.hist.max() as f64 / 1000.0
        },
        "cpu_seconds_per_gb": r.cpu_secs / (r.bytes as f64 / 1e9),
        "hit_ratio": r.hit_ratio,
        "evictions": r.evictions,
    })
}

/// The JSON array of `results`; `reference` adds fio's figures (the reference, both runs and
/// which was taken), the ratios and the target.
pub fn report_json(
    o: &Opts,
    results: &[WorkloadResult],
    reference: Option<&[FioBest]>,
) -> serde_json::Value {
    let v: Vec<_> = results
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut j = to_json(r);
            j["qd"] = o.qd.into();
            if let Some(f) = reference.and_then(|f| f.get(i)) {
                let best = f.best();
                j["fio"] = best.to_json();
                j["fio_runs"] = f.to_json();
                j["fio_taken"] = f.taken().name().into();
                j["ratio_bw"] = (r.bw() / best.bw).into();
                j["ratio_p99"] = (us(&r.hist, 0.99) / best.p99_us).into();
                j["target"] = crate::fio::target(&r.name, o.qd).into();
            }
            j
        })
        .collect();
    serde_json::Value::Array(v)
}

/// Prints results as a table (or JSON); `reference` adds fio's figures (both runs, the faster
/// marked as the reference) and the ratios.
pub fn report(o: &Opts, results: &[WorkloadResult], reference: Option<&[FioBest]>) {
    if o.json {
        println!("{}", report_json(o, results, reference));
        return;
    }
    println!(
        "page size {} KiB, {} shards, queue depth {} per shard",
        o.page_size >> 10,
        o.shards,
        o.qd
    );
    println!(
        "{:<10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6}",
        "workload",
        "MB/s",
        "IOPS",
        "p50 us",
        "p90 us",
        "p99 us",
        "p99.9 us",
        "max us",
        "CPU s/GB",
        "hits"
    );
    for (i, r) in results.iter().enumerate() {
        println!(
            "{:<10} {:>10.1} {:>10.0} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>8.2} {:>6}",
            r.name,
            r.bw() / 1e6,
            r.iops(),
            us(&r.hist, 0.5),
            us(&r.hist, 0.9),
            us(&r.hist, 0.99),
            us(&r.hist, 0.999),
            r.hist.max() as f64 / 1000.0,
            r.cpu_secs / (r.bytes as f64 / 1e9),
            r.hit_ratio
                .map_or("-".into(), |h| format!("{:.0}%", h * 100.0)),
        );
        if r.name == "write-full" {
            println!(
                "  {} inserts into the full cache evicted {} pages",
                r.ops, r.evictions
            );
        }
        let Some(f) = reference.and_then(|f| f.get(i)) else {
            continue;
        };
        for v in Variant::BOTH {
            let x = f.get(v);
            println!(
                "{:<10} {:>10.1} {:>10.0} {:>9.0} {:>9.0} {:>9.0}   {}{}",
                if v == Variant::Plain {
                    "  fio"
                } else {
                    "  fio+fb"
                },
                x.bw / 1e6,
                x.iops,
                x.p50_us,
                x.p90_us,
                x.p99_us,
                if v == Variant::Plain {
                    "(plain)"
                } else {
                    "(--fixedbufs --registerfiles)"
                },
                if f.taken() == v { " <- reference" } else { "" }
            );
        }
        let best = f.best();
        println!(
            "{:<10} {:>10.3} {:>10.3} {:>9} {:>9} {:>9.3}   (engine / the faster fio; p99: lower is better)",
            "  ratio",
            r.bw() / best.bw,
            r.iops() / best.iops,
            "",
            "",
            us(&r.hist, 0.99) / best.p99_us
        );
    }
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map_or(0, |pages| pages * 4096)
}

/// `restart`: fills a cache with `--pages` pages, then restarts it in a fresh process.
pub fn restart(o: &Opts) -> Result<()> {
    let per_shard = o.pages.div_ceil(o.shards as u64);
    let _ = std::fs::remove_dir_all(o.dir.join("engine"));
    std::fs::create_dir_all(o.dir.join("engine"))?;
    let engine = Engine::start(engine_config(o, per_shard))?;
    let t = Instant::now();
    drive(&engine, o, per_shard, Kind::Write { gen: 0 })?;
    let filled = totals(&engine)?.pages;
    if !o.json {
        println!(
            "filled {filled} pages of {} KiB in {:.1} s",
            o.page_size >> 10,
            t.elapsed().as_secs_f64()
        );
    }
    engine.shutdown()?;
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args([
        "restart-open",
        "--dir",
        &o.dir.display().to_string(),
        "--page-size",
        &o.page_size.to_string(),
        "--shards",
        &o.shards.to_string(),
        "--qd",
        &o.qd.to_string(),
        "--pages",
        &o.pages.to_string(),
    ]);
    if o.json {
        cmd.arg("--json");
    }
    let status = cmd.status()?;
    if !status.success() {
        bail!("restart-open failed");
    }
    Ok(())
}

/// The measured half of `restart`, in a process that has not touched the cache yet.
pub fn restart_open(o: &Opts) -> Result<()> {
    let per_shard = o.pages.div_ceil(o.shards as u64);
    let rss0 = rss_bytes();
    let t = Instant::now();
    let engine = Engine::start(engine_config(o, per_shard))?;
    let secs = t.elapsed().as_secs_f64();
    let rss = rss_bytes().saturating_sub(rss0);
    let st = totals(&engine)?;
    if o.json {
        println!(
            "{}",
            serde_json::json!({
                "mode": "restart", "pages_restored": st.recovered_pages, "open_seconds": secs,
                "slowest_shard_recovery_seconds": st.recovery_micros as f64 / 1e6,
                "rss_bytes_added": rss,
                "bytes_per_indexed_page": rss as f64 / st.recovered_pages.max(1) as f64,
            })
        );
        engine.shutdown()?;
        return Ok(());
    }
    println!(
        "restart: {} pages restored in {:.3} s (slowest shard's recovery {:.3} s); \
         resident memory +{:.1} MiB = {:.0} bytes per indexed page (includes the shards' I/O arenas)",
        st.recovered_pages,
        secs,
        st.recovery_micros as f64 / 1e6,
        rss as f64 / (1 << 20) as f64,
        rss as f64 / st.recovered_pages.max(1) as f64
    );
    engine.shutdown()?;
    Ok(())
}

/// `raw`: the same random reads as `read`/`read4k` (block = 4 KiB or the page size per workload),
/// issued with glommio's `DmaFile` directly on the cache files `local` left behind, with `--qd`
/// tasks per file on one executor per shard (`raw-*`: the engine's overhead is its ratio to
/// this), then on an io_uring each thread drives itself, tuned and plain (`ring-*`,
/// `ring-plain-*`, `uring.rs`: what a reactor other than glommio's would give).
pub fn raw(o: &Opts) -> Result<()> {
    let pages = (o.size / o.shards as u64 / o.page_size as u64).max(1);
    let geo = Geometry::new(o.page_size, 4096, pages as u32);
    let mut all = Vec::new();
    for w in &o.workloads {
        let block = match w.as_str() {
            "read" => o.page_size as u64,
            "read4k" => 4096,
            _ => continue,
        };
        let cpu0 = cpu_seconds();
        let start = Instant::now();
        let joins: Vec<_> = (0..o.shards)
            .map(|shard| {
                let path = pagestore_engine::shard_file(&o.dir.join("engine"), shard);
                let (qd, secs, seed, page) = (o.qd as u64, o.seconds, o.seed, o.page_size as u64);
                let pin = o.pin;
                let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
                glommio::LocalExecutorBuilder::new(if pin {
                    glommio::Placement::Fixed(shard % cpus)
                } else {
                    glommio::Placement::Unbound
                })
                .io_memory(page as usize * qd as usize)
                .spawn(move || async move {
                    let f = Rc::new(
                        glommio::io::DmaFile::open(&path)
                            .await
                            // glommio's errors are not Sync: anyhow cannot keep them.
                            .map_err(|e| anyhow!("{}: {e}", path.display()))?,
                    );
                    let deadline = Instant::now() + std::time::Duration::from_secs_f64(secs);
                    let mut tasks = Vec::new();
                    for t in 0..qd {
                        let f = f.clone();
                        tasks.push(glommio::spawn_local(async move {
                            let mut x = seed ^ (t + 1).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
                            let (mut ops, mut hist) = (0u64, new_hist());
                            let per_page = page / block;
                            while Instant::now() < deadline {
                                let r = rng_next(&mut x);
                                let pos = geo.data_off
                                    + (r % pages) * page
                                    + ((r >> 32) % per_page) * block;
                                let t0 = Instant::now();
                                let got = f
                                    .read_at_aligned(pos, block as usize)
                                    .await
                                    .map_err(|e| anyhow!("{e}"))?;
                                if got.len() as u64 != block {
                                    bail!("short read");
                                }
                                let _ = hist.record(t0.elapsed().as_nanos() as u64);
                                ops += 1;
                            }
                            Ok::<_, anyhow::Error>((ops, hist))
                        }));
                    }
                    let mut total = (0u64, new_hist());
                    for t in tasks {
                        let (ops, h) = t.await?;
                        total.0 += ops;
                        total.1.add(h)?;
                    }
                    Ok::<_, anyhow::Error>(total)
                })
                .map_err(|e| anyhow!("{e}"))
            })
            .collect();
        let mut ops = 0;
        let mut hist = new_hist();
        for j in joins {
            let (n, h) = j?.join().map_err(|e| anyhow!("{e}"))??;
            ops += n;
            hist.add(h)?;
        }
        let mut rs = vec![WorkloadResult::reads(
            format!("raw-{w}"),
            ops,
            block,
            start,
            cpu0,
            hist,
        )];
        // The same reads on a ring each thread drives itself, tuned and plain.
        let files: Vec<_> = (0..o.shards)
            .map(|s| pagestore_engine::shard_file(&o.dir.join("engine"), s))
            .collect();
        let area = uring::Area {
            data_off: geo.data_off,
            pages,
            page: o.page_size as u64,
            block,
        };
        for setup in [uring::RingSetup::Tuned, uring::RingSetup::Plain] {
            let cpu0 = cpu_seconds();
            let start = Instant::now();
            let (ops, hist) =
                uring::read_random_on_threads(&files, area, o.qd, o.seconds, o.seed, setup, o.pin)?;
            let name = format!("{}-{w}", setup.name());
            rs.push(WorkloadResult::reads(name, ops, block, start, cpu0, hist));
        }
        if !o.json {
            report(o, &rs, None);
        } else {
            all.extend(rs);
        }
    }
    if o.json {
        report(o, &all, None);
    }
    Ok(())
}

/// `scale`: runs the selected workloads with 1, 2, 4 ... up to `--shards` shards (the dataset
/// grows with the shard count, so every shard has the same amount of data) and prints throughput
/// and throughput per shard for each.
/// 1, 2, 4 ... up to `max`, and `max` itself: the shard counts a scaling sweep runs.
pub fn shard_counts(max: usize) -> Vec<usize> {
    let max = max.max(1);
    let mut counts = Vec::new();
    let mut n = 1;
    while n < max {
        counts.push(n);
        n *= 2;
    }
    counts.push(max);
    counts
}

pub fn scale(o: &Opts) -> Result<()> {
    let counts = shard_counts(o.shards);
    let per_shard_size = o.size / o.shards as u64;
    if !o.json {
        println!(
            "{:<8} {:>7} {:>12} {:>12} {:>14} {:>10}",
            "workload", "shards", "MB/s", "IOPS", "MB/s per shard", "vs 1 shard"
        );
    }
    let mut rows = Vec::new();
    let mut base: HashMap<String, f64> = HashMap::new();
    for shards in counts {
        let run = Opts {
            shards,
            size: per_shard_size * shards as u64,
            ..o.clone()
        };
        for r in run_local(&run)? {
            let per = r.bw() / shards as f64;
            let first = *base.entry(r.name.clone()).or_insert(per);
            if o.json {
                let mut j = to_json(&r);
                j["shards"] = shards.into();
                j["bytes_per_sec_per_shard"] = per.into();
                j["vs_one_shard"] = (per / first).into();
                rows.push(j);
                continue;
            }
            println!(
                "{:<8} {:>7} {:>12.1} {:>12.0} {:>14.1} {:>10.2}",
                r.name,
                shards,
                r.bw() / 1e6,
                r.iops(),
                per / 1e6,
                per / first
            );
        }
    }
    if o.json {
        println!("{}", serde_json::Value::Array(rows));
    }
    Ok(())
}
