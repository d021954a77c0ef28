//! `pagebench compare --workloads preload`: a preload job of a generated manifest of many small
//! files (`--manifest-files`, default 10,000, of `--manifest-file-size`) through the real
//! `pagectl load`, against the bandwidths that bound it, measured in the same run:
//!
//! - **time to first page**: from spawning `pagectl load` to the first page cached on any node
//!   (the nodes' page counters, polled every 2 ms); to the job's end (the process exits); and
//!   to every page of the manifest counted as cached on the nodes (a shard answers a load as
//!   soon as it has the bytes and stores them just after, so this can be a little later);
//! - **UFS read bandwidth**: object_store reading the same files straight from the under
//!   storage, as many files in flight as `pagectl load` keeps (16);
//! - **disk write bandwidth**: fio writing to the nodes' file system with O_DIRECT, one job per
//!   shard, in blocks the size of what a preload writes per page (at its best: plain and with
//!   `--fixedbufs --registerfiles`, the faster taken);
//! - preload throughput against min(UFS read, disk write).
//!
//! Afterwards a sample of the files is read through the client: every page a hit, every byte
//! what the generator wrote.

use std::{
    io::Read,
    path::Path,
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};
use futures_util::{stream, StreamExt};
use pagestore_client::ufs::MountTable;

use crate::{
    bench::{self, cluster_hits},
    dataset::{self, Dataset, Dest, EpisodeSpec},
    fio::{self, FioBest},
    frontends::{tool_binary, Stack, PREFIX},
    Opts,
};

/// Files `pagectl load` keeps in flight by default.
const LOAD_PARALLEL: usize = 16;

/// What the preload part measured.
pub struct Preload {
    files: u64,
    bytes: u64,
    first_page: Option<f64>,
    completion: f64,
    all_cached: Option<f64>,
    pagectl_first_page: Option<f64>,
    pagectl_completion: Option<f64>,
    ufs_bps: f64,
    disk: FioBest,
    disk_block: u64,
    cpu_nodes: f64,
    verified_files: u64,
    sample_hits: (u64, u64),
    notes: Vec<String>,
}

impl Preload {
    fn bps(&self) -> f64 {
        self.bytes as f64 / self.completion.max(1e-9)
    }

    fn disk_bps(&self) -> f64 {
        self.disk.best().bw
    }

    fn bound(&self) -> f64 {
        self.ufs_bps.min(self.disk_bps())
    }

    /// JSON form.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "files": self.files, "bytes": self.bytes,
            "submission_to_first_page_secs": self.first_page,
            "submission_to_completion_secs": self.completion,
            "submission_to_all_pages_cached_secs": self.all_cached,
            "pagectl_reported": {"first_page_secs": self.pagectl_first_page,
                                 "completion_secs": self.pagectl_completion},
            "preload_bytes_per_sec": self.bps(),
            "ufs_read_bytes_per_sec": self.ufs_bps,
            "disk_write_bytes_per_sec": self.disk_bps(),
            "disk_write_fio": self.disk.to_json(),
            "disk_write_block": self.disk_block,
            "ratio_to_bound": self.bps() / self.bound().max(1e-9),
            "node_cpu_seconds_per_gb": self.cpu_nodes / (self.bytes as f64 / 1e9).max(1e-12),
            "verified_files": self.verified_files,
            "sample_hits": self.sample_hits.0, "sample_misses": self.sample_hits.1,
            "setup": self.notes,
        })
    }

    /// Prints the human form.
    pub fn print(&self) {
        for n in &self.notes {
            println!("{n}");
        }
        let opt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.3} s"));
        println!(
            "preload of {} files ({:.1} MB) with pagectl load --manifest:",
            self.files,
            self.bytes as f64 / 1e6
        );
        println!(
            "  submission -> first page cached {} (pagectl says {}); -> completion (pagectl \
             exits) {:.3} s (pagectl says {}); -> every page cached {}",
            opt(self.first_page),
            opt(self.pagectl_first_page),
            self.completion,
            opt(self.pagectl_completion),
            opt(self.all_cached)
        );
        println!(
            "  preload {:.1} MB/s | UFS read {:.1} MB/s (object_store, {LOAD_PARALLEL} files in \
             flight) | disk write {:.1} MB/s (fio, {} KiB blocks; plain {:.1}, --fixedbufs \
             --registerfiles {:.1}) | preload / min = {:.2}x",
            self.bps() / 1e6,
            self.ufs_bps / 1e6,
            self.disk_bps() / 1e6,
            self.disk_block >> 10,
            self.disk.plain.bw / 1e6,
            self.disk.registered.bw / 1e6,
            self.bps() / self.bound().max(1e-9)
        );
        if self.all_cached.is_none() {
            println!(
                "  not every page was cached 30 s after the job ended: pages were evicted or \
                 failed to store (see the nodes' logs; PAGESTORE_LOG=info)"
            );
        }
        println!(
            "  node CPU {:.2} s/GB; afterwards {} sampled files read through the client: {} \
             hits, {} misses, byte-exact",
            self.cpu_nodes / (self.bytes as f64 / 1e9).max(1e-12),
            self.verified_files,
            self.sample_hits.0,
            self.sample_hits.1
        );
    }
}

/// The disk's O_DIRECT write bandwidth in `block`s on the file system of `dir`: `jobs` fio
/// jobs `qd` deep, each writing a fresh file of `bytes / jobs` (64 MiB to 1 GiB), at its best.
fn fio_write(o: &Opts, dir: &Path, jobs: usize, block: u64, bytes: u64) -> Result<FioBest> {
    let per_job = (bytes / jobs as u64).clamp(64 << 20, 1 << 30);
    let f = Opts {
        dir: dir.to_path_buf(),
        size: per_job * jobs as u64,
        shards: jobs,
        page_size: u32::try_from(block).map_err(|_| anyhow!("block too large for fio"))?,
        ..o.clone()
    };
    let r = fio::best_of(|v| fio::run_fio(&f, "write", v));
    let _ = std::fs::remove_dir_all(dir.join("fio"));
    r
}

/// `time to first page 0.123 s; to completion 4.56 s (...)` from pagectl's standard output.
fn parse_pagectl(out: &str) -> (Option<f64>, Option<f64>) {
    let num = |s: &str| s.trim().trim_end_matches(" s").trim().parse::<f64>().ok();
    for line in out.lines() {
        if let Some(rest) = line.strip_prefix("time to first page ") {
            let (first, rest) = rest.split_once(';').unwrap_or((rest, ""));
            let done = rest
                .trim()
                .strip_prefix("to completion ")
                .and_then(|r| r.split_whitespace().next())
                .and_then(|v| v.parse().ok());
            return (num(first), done);
        }
    }
    (None, None)
}

/// Runs the preload measurement over a generated manifest (`--manifest-files` of
/// `--manifest-file-size`, under `DIR/preload`).
pub fn run_preload(o: &Opts) -> Result<Preload> {
    let rt = bench::runtime(2)?;
    let ds = Dataset {
        seed: o.seed,
        files: 0,
        file_size: 0,
        episodes: EpisodeSpec {
            count: 0,
            ..EpisodeSpec::default()
        },
        small_files: o.manifest_files,
        small_size: o.manifest_file_size,
    };
    let work = o.dir.join("preload");
    let data = work.join("dataset");
    std::fs::create_dir_all(&data).with_context(|| data.display().to_string())?;
    let g = dataset::generate(&ds, &Dest::Dir(data.clone()), &rt)?;
    let notes = vec![format!(
        "manifest dataset {}: {} files of {} bytes (wrote {}, kept {})",
        data.display(),
        ds.small_files,
        ds.small_size,
        g.written,
        g.kept
    )];
    preload_files(o, &work, &data, &ds.small(), notes, &rt)
}

/// The preload measurement of `entries`, files of the dataset root `data` (already written):
/// a manifest of them and a cold cluster (`--nodes`, default 3) under `work`, the UFS read and
/// disk write references, the timed `pagectl load`, and a sample read back. The cluster is
/// stopped (and its caches removed) on return.
pub(crate) fn preload_files(
    o: &Opts,
    work: &Path,
    data: &Path,
    entries: &[dataset::Entry],
    mut notes: Vec<String>,
    rt: &tokio::runtime::Runtime,
) -> Result<Preload> {
    let pagectl = tool_binary("pagectl")?;
    std::fs::create_dir_all(work).with_context(|| work.display().to_string())?;
    let manifest = work.join("manifest.txt");
    let text: String = entries
        .iter()
        .map(|e| format!("{PREFIX}/{}\n", e.rel))
        .collect();
    std::fs::write(&manifest, text).with_context(|| manifest.display().to_string())?;
    let nodes = o.nodes.unwrap_or(3);
    let total: u64 = entries.iter().map(|e| e.size).sum();
    let stack = Stack::start(o, work, data, nodes, entries.iter().map(|e| e.size), rt)?;
    notes.push(format!(
        "cluster: {nodes} pagestored x {} shard(s), {} KiB pages, cold",
        o.shards,
        o.page_size >> 10
    ));

    let ufs_bps = ufs_read_bps(o, data, entries, rt)?;

    // The disk's write bandwidth at the size a preload writes per page.
    let block = entries
        .iter()
        .map(|e| e.size)
        .max()
        .unwrap_or(4096)
        .min(u64::from(o.page_size))
        .next_multiple_of(4096);
    let jobs = nodes * o.shards.max(1);
    let disk = fio_write(o, work, jobs, block, total)?;

    let job = run_job(o, &pagectl, &stack, &manifest, entries, rt)?;
    let (verified_files, sample_hits) = verify_sample(&stack, entries, rt)?;
    Ok(Preload {
        files: entries.len() as u64,
        bytes: total,
        first_page: job.first_page,
        completion: job.completion,
        all_cached: job.all_cached,
        pagectl_first_page: job.pagectl_first_page,
        pagectl_completion: job.pagectl_completion,
        ufs_bps,
        disk,
        disk_block: block,
        cpu_nodes: job.cpu_nodes,
        verified_files,
        sample_hits,
        notes,
    })
}

/// The under storage's read bandwidth for these files, at pagectl load's parallelism.
fn ufs_read_bps(
    o: &Opts,
    data: &std::path::Path,
    entries: &[dataset::Entry],
    rt: &tokio::runtime::Runtime,
) -> Result<f64> {
    let data_abs = std::fs::canonicalize(data).with_context(|| data.display().to_string())?;
    let url = bench::with_emulation(&format!("file://{}", data_abs.display()), o);
    let table = Arc::new(MountTable::new(&[(PREFIX.to_string(), url)])?);
    let t0 = Instant::now();
    let read: u64 = rt.block_on(async {
        let got: Vec<Result<u64>> = stream::iter(entries.iter())
            .map(|e| {
                let table = table.clone();
                async move {
                    let path = format!("{PREFIX}/{}", e.rel);
                    let info = table.stat(&path).await?;
                    let b = table.read(&info, 0..info.size).await?;
                    Ok(b.len() as u64)
                }
            })
            .buffer_unordered(LOAD_PARALLEL)
            .collect()
            .await;
        got.into_iter().sum::<Result<u64>>()
    })?;
    Ok(read as f64 / t0.elapsed().as_secs_f64().max(1e-9))
}

/// What the timed `pagectl load` job measured.
struct JobTimes {
    first_page: Option<f64>,
    completion: f64,
    all_cached: Option<f64>,
    pagectl_first_page: Option<f64>,
    pagectl_completion: Option<f64>,
    cpu_nodes: f64,
}

/// Runs `pagectl load --manifest` against the cluster, polling the nodes' page counters for
/// the first page, then waits (at most 30 s after the job) until every page counts as cached.
fn run_job(
    o: &Opts,
    pagectl: &std::path::Path,
    stack: &Stack,
    manifest: &std::path::Path,
    entries: &[dataset::Entry],
    rt: &tokio::runtime::Runtime,
) -> Result<JobTimes> {
    let total: u64 = entries.iter().map(|e| e.size).sum();
    let (_, base_pages) = pages_and_hits(stack, rt);
    let cpu0: f64 = stack.pids().iter().map(|p| bench::proc_cpu(*p)).sum();
    let t0 = Instant::now();
    let mut child = Command::new(pagectl)
        .arg("--cluster")
        .arg(&stack.cluster.members)
        .arg("--tls-dir")
        .arg(&stack.cluster.ca_dir)
        .args(["load", "--manifest"])
        .arg(manifest)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| pagectl.display().to_string())?;
    let mut first_page = None;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if first_page.is_none() {
            let (_, pages) = pages_and_hits(stack, rt);
            if pages > base_pages {
                first_page = Some(t0.elapsed().as_secs_f64());
            }
            std::thread::sleep(Duration::from_millis(2));
        } else {
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let completion = t0.elapsed().as_secs_f64();
    let cpu_nodes = stack
        .pids()
        .iter()
        .map(|p| bench::proc_cpu(*p))
        .sum::<f64>()
        - cpu0;
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_string(&mut err);
    }
    if !status.success() {
        bail!("pagectl load failed ({status}):\n{out}{err}");
    }
    if first_page.is_none() && total > 0 {
        // The job was faster than one poll.
        first_page = Some(completion);
    }
    // A shard answers a load once it has the bytes, and stores them right after: wait until
    // the nodes count every page (at most 30 s).
    let want: u64 = entries
        .iter()
        .map(|e| e.size.div_ceil(u64::from(o.page_size)).max(1))
        .sum();
    let all_cached = wait_cached(stack, base_pages + want, Duration::from_secs(30), rt)
        .then(|| t0.elapsed().as_secs_f64());
    let (pagectl_first_page, pagectl_completion) = parse_pagectl(&out);
    Ok(JobTimes {
        first_page,
        completion,
        all_cached,
        pagectl_first_page,
        pagectl_completion,
        cpu_nodes,
    })
}

/// Reads a sample of the files through the client: every sampled file is now a hit, and
/// byte-exact. Returns the files read and the (hits, misses) they counted.
fn verify_sample(
    stack: &Stack,
    entries: &[dataset::Entry],
    rt: &tokio::runtime::Runtime,
) -> Result<(u64, (u64, u64))> {
    let client = stack.client.clone();
    let sample: Vec<_> = entries.iter().step_by(97).cloned().collect();
    let before = rt.block_on(cluster_hits(&client)).unwrap_or_default();
    rt.block_on(async {
        for e in &sample {
            let path = format!("{PREFIX}/{}", e.rel);
            let b = client
                .read(&path, 0..e.size)
                .await
                .with_context(|| path.clone())?;
            if b.len() as u64 != e.size || dataset::check(e.key, 0, &b).is_err() {
                bail!("{path}: the bytes read after the preload are wrong");
            }
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let after = rt.block_on(cluster_hits(&client)).unwrap_or_default();
    let sample_hits = (after.0 - before.0, after.1 - before.1);
    Ok((sample.len() as u64, sample_hits))
}

/// Waits (polling every 2 ms, at most `limit`) until the cluster counts at least `pages`
/// pages cached; whether it did.
pub(crate) fn wait_cached(
    stack: &Stack,
    pages: u64,
    limit: Duration,
    rt: &tokio::runtime::Runtime,
) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if pages_and_hits(stack, rt).1 >= pages {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// (hits, pages cached) over the cluster.
pub(crate) fn pages_and_hits(stack: &Stack, rt: &tokio::runtime::Runtime) -> (u64, u64) {
    let stats = rt.block_on(stack.client.shard_stats());
    stats
        .iter()
        .filter_map(|(_, _, c)| *c)
        .fold((0, 0), |a, c| (a.0 + c.hits, a.1 + c.pages))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pagectl_times_are_parsed() {
        let out = "loaded 3 pages (1.0 MB) from the under storage, 0 pages were cached \
                   already; 0 of 3 files failed\ntime to first page 0.125 s; to completion \
                   2.50 s (0.4 MB/s over 1.0 MB)\n";
        assert_eq!(parse_pagectl(out), (Some(0.125), Some(2.5)));
        assert_eq!(
            parse_pagectl("time to first page -; to completion 0.01 s (x)"),
            (None, Some(0.01))
        );
        assert_eq!(parse_pagectl("nothing"), (None, None));
    }
}
