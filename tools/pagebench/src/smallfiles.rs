//! `pagebench smallfiles` (issue 15): many small files, each opened, stat'ed and read whole,
//! `--parallel` at a time, through every front door, against object_store reading the same
//! local-directory store directly, all in one run:
//!
//! - **direct** (the reference): object_store through the mount table, straight from the
//!   directory: a stat (`head`) and a read of the whole object per file. The files are read
//!   once untimed first, so the reference is a page-cached local directory: the fastest store
//!   there is, and the hardest one for a cache to beat;
//! - **client-cold**, **client-warm**: the client library against `--nodes` real `pagestored`
//!   (`Client::open`, which stats the file at its metadata owner, then `read_at` of the whole
//!   file): first with an empty cache (every file a metadata and a page miss, loaded by the
//!   owners), then again;
//! - **pagefs-warm**: a `pagefs` mount of the same cluster: `open`, `fstat`, `read` to the end;
//! - **pages3-warm**: a `pages3` gateway in front of it, read with object_store's S3 client (a
//!   HEAD and a GET per file), as the `s3` target does;
//! - **preload**: a `pagectl load` of the same files into a fresh, cold cluster against
//!   min(UFS read, disk write), with the time to the first page: the preload code of
//!   `compare --workloads preload` (`preload.rs`), run on this dataset.
//!
//! Every file read on every path is checked: its length, and its crc32 against the
//! generator's.

use std::{
    io::Read as _,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};
use bytes::Bytes;
use futures_util::{stream, StreamExt};
use hdrhistogram::Histogram;
use pagestore_client::{ufs::MountTable, Client};

use crate::{
    bench::{self, Probe, RunResult},
    dataset::{self, Dataset, Dest, Entry, EpisodeSpec},
    frontends::{self, FuseMount, Gateway, Stack, PREFIX},
    local::new_hist,
    modes::{load_warning, loadavg},
    preload::{self, Preload},
    Opts,
};

/// One way to open, stat and read a file whole.
enum Route {
    /// object_store through a mount table: `stat` (a HEAD), then `read` of the whole object.
    Store {
        /// The table.
        table: Arc<MountTable>,
        /// The logical prefix the dataset root is mounted at.
        prefix: String,
    },
    /// The client library: `open` (a stat at the file's metadata owner), then `read_at` of
    /// the whole file, of the files under this prefix.
    Client(Arc<Client>, &'static str),
    /// Plain files under this root: `open`, `fstat`, `read` to the end.
    Fs(PathBuf),
}

/// The files, and the crc32 of each as the generator wrote it.
struct Files {
    entries: Vec<Entry>,
    crcs: Vec<u32>,
}

impl Files {
    fn new(entries: Vec<Entry>) -> Result<Files> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let chunk = entries.len().div_ceil(threads).max(1);
        let crcs = std::thread::scope(|s| {
            let joins: Vec<_> = entries
                .chunks(chunk)
                .map(|part| {
                    s.spawn(move || {
                        let mut buf = Vec::new();
                        part.iter()
                            .map(|e| {
                                buf.resize(e.size as usize, 0);
                                dataset::fill(e.key, 0, &mut buf);
                                crc32fast::hash(&buf)
                            })
                            .collect::<Vec<u32>>()
                    })
                })
                .collect();
            let mut crcs = Vec::with_capacity(entries.len());
            for j in joins {
                crcs.extend(j.join().map_err(|_| anyhow!("checksum thread panicked"))?);
            }
            Ok::<_, anyhow::Error>(crcs)
        })?;
        Ok(Files { entries, crcs })
    }

    fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.size).sum()
    }

    /// Checks what `label` read for file `i`.
    fn check(&self, label: &str, i: usize, got: &[u8]) -> Result<()> {
        let e = &self.entries[i];
        let crc = crc32fast::hash(got);
        if got.len() as u64 != e.size || crc != self.crcs[i] {
            bail!(
                "{label}: {}: {} bytes with crc32 {crc:08x}; the generator wrote {} bytes with \
                 crc32 {:08x}",
                e.rel,
                got.len(),
                e.size,
                self.crcs[i]
            );
        }
        Ok(())
    }
}

/// What one pass counted.
struct Tally {
    files: u64,
    bytes: u64,
    hist: Histogram<u64>,
    /// Client passes: each file's open (its stat at the metadata owner) and read (its page
    /// fetches), apart.
    open: Histogram<u64>,
    read: Histogram<u64>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            files: 0,
            bytes: 0,
            hist: new_hist(),
            open: new_hist(),
            read: new_hist(),
        }
    }

    fn record(&mut self, took: Duration, bytes: u64) {
        self.hist.saturating_record(took.as_nanos() as u64);
        self.files += 1;
        self.bytes += bytes;
    }

    fn add(&mut self, o: &Tally) -> Result<()> {
        self.files += o.files;
        self.bytes += o.bytes;
        self.hist.add(&o.hist)?;
        Ok(())
    }
}

/// Opens, stats and reads every file once through an async route, `parallel` at a time.
async fn pass_async(label: &str, route: &Route, files: &Files, parallel: usize) -> Result<Tally> {
    let one = |i: usize| async move {
        let e = &files.entries[i];
        let t0 = Instant::now();
        let mut opened = None;
        let b: Bytes = match route {
            Route::Store { table, prefix } => {
                let path = format!("{prefix}/{}", e.rel);
                let info = table.stat(&path).await.with_context(|| path.clone())?;
                table
                    .read(&info, 0..info.size)
                    .await
                    .with_context(|| path.clone())?
            }
            Route::Client(client, prefix) => {
                let path = format!("{prefix}/{}", e.rel);
                let h = client.open(&path).await.with_context(|| path.clone())?;
                opened = Some(t0.elapsed());
                client
                    .read_at(h.info(), 0, h.info().size)
                    .await
                    .with_context(|| path.clone())?
            }
            Route::Fs(_) => bail!("{label}: plain files are read by threads"),
        };
        let took = t0.elapsed();
        files.check(label, i, &b)?;
        Ok::<_, anyhow::Error>((took, opened, b.len() as u64))
    };
    let mut s = std::pin::pin!(stream::iter(0..files.entries.len())
        .map(one)
        .buffer_unordered(parallel.max(1)));
    let mut t = Tally::new();
    while let Some(r) = s.next().await {
        let (took, opened, n) = r?;
        t.record(took, n);
        if let Some(o) = opened {
            t.open.saturating_record(o.as_nanos() as u64);
            t.read
                .saturating_record(took.saturating_sub(o).as_nanos() as u64);
        }
    }
    Ok(t)
}

/// Opens, stats and reads every file once under `root`, from `parallel` threads.
fn pass_fs(label: &str, root: &Path, files: &Files, parallel: usize) -> Result<Tally> {
    let next = AtomicUsize::new(0);
    let results: Vec<Result<Tally>> = std::thread::scope(|s| {
        let joins: Vec<_> = (0..parallel.max(1))
            .map(|_| {
                s.spawn(|| {
                    let mut t = Tally::new();
                    let mut buf = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(e) = files.entries.get(i) else {
                            return Ok(t);
                        };
                        let path = root.join(&e.rel);
                        let t0 = Instant::now();
                        let mut f = std::fs::File::open(&path)
                            .with_context(|| path.display().to_string())?;
                        let size = f
                            .metadata()
                            .with_context(|| path.display().to_string())?
                            .len();
                        buf.clear();
                        buf.reserve(size as usize);
                        f.read_to_end(&mut buf)
                            .with_context(|| path.display().to_string())?;
                        let took = t0.elapsed();
                        files.check(label, i, &buf)?;
                        t.record(took, buf.len() as u64);
                    }
                })
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

/// Where the cluster's `write=back` mount of the `client-written` pass is.
const WRITTEN: &str = "/written";

/// Writes every file through the cluster under [`WRITTEN`], `parallel` at a time, and waits
/// until the flush has put them all in the store.
async fn write_through(client: &Arc<Client>, files: &Files, parallel: usize) -> Result<()> {
    let one = |i: usize| async move {
        let e = &files.entries[i];
        let mut buf = vec![0u8; e.size as usize];
        dataset::fill(e.key, 0, &mut buf);
        let path = format!("{WRITTEN}/{}", e.rel);
        client
            .write_file(&path, Bytes::from(buf))
            .await
            .with_context(|| path.clone())?;
        Ok::<_, anyhow::Error>(())
    };
    let mut s = std::pin::pin!(stream::iter(0..files.entries.len())
        .map(one)
        .buffer_unordered(parallel.max(1)));
    while let Some(r) = s.next().await {
        r?;
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let state = client.write_back_state(WRITTEN).await?;
        if state.files_dirty == 0 && state.deletes_pending == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{WRITTEN}: not flushed after 600 s: {state:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How many listings `smallfiles` times under each mount (each directory of the dataset at
/// least once).
const LISTINGS: usize = 50;

/// Lists the directories of the dataset whole through `client` (every page), in turn until
/// `at_least` listings were made of each root, alternately under [`WRITTEN`] and under
/// [`PREFIX`]: how many directories, and the time of each listing in nanoseconds (written
/// copy, dataset). Both must list the same names.
async fn time_listings(
    client: &Client,
    files: &Files,
    at_least: usize,
) -> Result<(usize, [Histogram<u64>; 2])> {
    let mut dirs: Vec<&str> = files
        .entries
        .iter()
        .map(|e| e.rel.rsplit_once('/').map_or("", |(d, _)| d))
        .collect();
    dirs.sort_unstable();
    dirs.dedup();
    let mut hists = [new_hist(), new_hist()];
    for d in dirs.iter().cycle().take(at_least.max(dirs.len())) {
        let mut names: [Vec<String>; 2] = Default::default();
        for (i, root) in [WRITTEN, PREFIX].into_iter().enumerate() {
            let path = if d.is_empty() {
                root.to_string()
            } else {
                format!("{root}/{d}")
            };
            let t = Instant::now();
            let listed = client.list(&path).await.with_context(|| path.clone())?;
            hists[i].record(t.elapsed().as_nanos() as u64)?;
            names[i] = listed.into_iter().map(|e| e.name).collect();
        }
        if names[0] != names[1] {
            bail!(
                "{WRITTEN}/{d} lists {} entries, {PREFIX}/{d} {}: the written copy differs",
                names[0].len(),
                names[1].len()
            );
        }
    }
    Ok((dirs.len(), hists))
}

/// One timed pass of every file through `route`, with what `probe` saw meanwhile.
fn pass(
    o: &Opts,
    label: &str,
    route: &Route,
    files: &Files,
    probe: &Probe,
    rt: &tokio::runtime::Runtime,
) -> Result<RunResult> {
    pass_phases(o, label, route, files, probe, rt).map(|(r, _)| r)
}

/// The p50 and p99 of a client pass's opens and reads, microseconds.
#[derive(Clone, Copy)]
struct Phases {
    open: [f64; 2],
    read: [f64; 2],
}

/// [`pass`], with the client's open and read apart (client passes only).
fn pass_phases(
    o: &Opts,
    label: &str,
    route: &Route,
    files: &Files,
    probe: &Probe,
    rt: &tokio::runtime::Runtime,
) -> Result<(RunResult, Option<Phases>)> {
    let (t, m) = probe.measure(rt, || match route {
        Route::Fs(root) => pass_fs(label, root, files, o.parallel),
        _ => rt.block_on(pass_async(label, route, files, o.parallel)),
    })?;
    if t.files != files.entries.len() as u64 || t.bytes != files.bytes() {
        bail!(
            "{label}: read {} files ({} bytes) of {} ({} bytes)",
            t.files,
            t.bytes,
            files.entries.len(),
            files.bytes()
        );
    }
    let q = |h: &Histogram<u64>| {
        [
            h.value_at_quantile(0.5) as f64 / 1e3,
            h.value_at_quantile(0.99) as f64 / 1e3,
        ]
    };
    let phases = (!t.open.is_empty()).then(|| Phases {
        open: q(&t.open),
        read: q(&t.read),
    });
    let run = RunResult {
        target: label.into(),
        workload: "smallfiles".into(),
        readers: o.parallel,
        qd: 1,
        block: o.file_size,
        ops: t.files,
        bytes: t.bytes,
        secs: m.secs,
        hist: t.hist,
        cpu_bench: m.cpu_bench,
        cpu_frontend: m.cpu_frontend,
        cpu_nodes: m.cpu_nodes,
        hits: m.hits,
        verified_ops: t.files,
        verified_bytes: t.bytes,
        ranges: 0,
        pages_touched: 0,
    };
    Ok((run, phases))
}

/// The mount-table URL of the dataset directory (with `--ufs-latency-ms`, `--ufs-mbps`).
fn dir_url(o: &Opts, data: &Path) -> Result<String> {
    let abs = std::fs::canonicalize(data).with_context(|| data.display().to_string())?;
    Ok(bench::with_emulation(
        &format!("file://{}", abs.display()),
        o,
    ))
}

/// What the command measured.
struct Outcome {
    notes: Vec<String>,
    skipped: Vec<String>,
    paths: Vec<RunResult>,
    /// The client passes' opens and reads apart, by label.
    phases: Vec<(String, Phases)>,
    preload: Preload,
}

/// Runs `pagebench smallfiles`.
pub fn run_smallfiles(o: &Opts) -> Result<()> {
    let warning = load_warning();
    let load0 = loadavg();
    let rt = bench::runtime(2)?;
    let work = o.dir.join("smallfiles");
    let data = work.join("dataset");
    std::fs::create_dir_all(&data).with_context(|| data.display().to_string())?;
    let ds = Dataset {
        seed: o.seed,
        files: 0,
        file_size: 0,
        episodes: EpisodeSpec {
            count: 0,
            ..EpisodeSpec::default()
        },
        small_files: o.small_files,
        small_size: o.file_size,
    };
    let g = dataset::generate(&ds, &Dest::Dir(data.clone()), &rt)?;
    let files = Files::new(ds.small())?;
    let mut notes = vec![format!(
        "dataset {}: {} files of {} bytes ({:.1} MB; wrote {} in {:.1} s, kept {})",
        data.display(),
        ds.small_files,
        ds.small_size,
        files.bytes() as f64 / 1e6,
        g.written,
        g.secs,
        g.kept
    )];
    let out = measure(o, &work, &data, &files, &mut notes, &rt)?;
    let load1 = loadavg();
    if o.json {
        print_json(o, &out, &files, warning, load0, load1);
    } else {
        print_text(o, &out, &files, warning, load0, load1);
    }
    Ok(())
}

/// Every pass, then the preload.
fn measure(
    o: &Opts,
    work: &Path,
    data: &Path,
    files: &Files,
    notes: &mut Vec<String>,
    rt: &tokio::runtime::Runtime,
) -> Result<Outcome> {
    let mut paths = Vec::new();
    let mut skipped = Vec::new();
    let url = dir_url(o, data)?;
    let direct = Route::Store {
        table: Arc::new(MountTable::new(&[(PREFIX.to_string(), url.clone())])?),
        prefix: PREFIX.into(),
    };
    // Once untimed: the reference reads a page-cached directory, whatever ran before.
    rt.block_on(pass_async("direct", &direct, files, o.parallel))?;
    notes.push(format!(
        "direct: object_store straight from {} (page-cached: read once before the timed pass)",
        pagestore_client::ufs::redact(&url)
    ));
    paths.push(pass(o, "direct", &direct, files, &Probe::default(), rt)?);

    let nodes = o.nodes.unwrap_or(3);
    let written_store = work.join("written-store");
    let _ = std::fs::remove_dir_all(&written_store);
    std::fs::create_dir_all(&written_store).with_context(|| written_store.display().to_string())?;
    let sizes = files.entries.iter().map(|e| e.size);
    // Room for the dataset's pages, and for the written copies' on every write replica.
    let sizes = sizes.clone().chain(sizes.clone()).chain(sizes);
    let stack = Stack::start_with(
        o,
        work,
        data,
        nodes,
        sizes,
        vec![format!(
            "{WRITTEN}=file://{}?write=back",
            written_store.display()
        )],
        rt,
    )?;
    notes.push(format!(
        "cluster: {nodes} pagestored x {} shard(s), {} KiB pages, the directory mounted at \
         {PREFIX}; cold, then warm",
        o.shards,
        o.page_size >> 10
    ));
    let probe = |frontend: Vec<u32>| Probe {
        counters: Some(stack.client.clone()),
        nodes: stack.pids(),
        frontend,
    };
    let client = Route::Client(stack.client.clone(), PREFIX);
    let (_, base) = preload::pages_and_hits(&stack, rt);
    let mut phases = Vec::new();
    let (r, p) = pass_phases(o, "client-cold", &client, files, &probe(vec![]), rt)?;
    paths.push(r);
    phases.extend(p.map(|p| ("client-cold".to_string(), p)));
    // A shard answers a miss as soon as it has the bytes and stores them just after: the warm
    // passes start once every page is counted as cached.
    let page = u64::from(o.page_size).max(1);
    let want: u64 = files
        .entries
        .iter()
        .map(|e| e.size.div_ceil(page).max(1))
        .sum();
    let t0 = Instant::now();
    if !preload::wait_cached(&stack, base + want, Duration::from_secs(30), rt) {
        bail!(
            "client-cold: the cluster did not count all {want} pages as cached 30 s after the \
             pass (evicted, or not stored: see the nodes' logs, PAGESTORE_LOG=info)"
        );
    }
    notes.push(format!(
        "client-cold: every page counted as cached {:.3} s after the pass",
        t0.elapsed().as_secs_f64()
    ));
    let (r, p) = pass_phases(o, "client-warm", &client, files, &probe(vec![]), rt)?;
    paths.push(r);
    phases.extend(p.map(|p| ("client-warm".to_string(), p)));

    let t0 = Instant::now();
    rt.block_on(write_through(&stack.client, files, o.parallel))?;
    notes.push(format!(
        "client-written: the same files written through the cluster to {WRITTEN} (write=back, \
         the nodes' default --write-replicas) in {:.1} s and flushed, then read as client-warm \
         reads: each open's StatPath first takes the path's records from nodes - \
         write_replicas peers",
        t0.elapsed().as_secs_f64()
    ));
    let written = Route::Client(stack.client.clone(), WRITTEN);
    let (r, p) = pass_phases(o, "client-written", &written, files, &probe(vec![]), rt)?;
    paths.push(r);
    phases.extend(p.map(|p| ("client-written".to_string(), p)));
    let (dirs, [w, d]) = rt.block_on(time_listings(&stack.client, files, LISTINGS))?;
    let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1e3;
    notes.push(format!(
        "listings: the dataset's {dirs} director(ies) listed whole through the client \
         (Client::list, every page) {} times under each mount, alternately under {WRITTEN} \
         (write=back: before the first page of each listing the directory's metadata owner \
         takes its entries' records from nodes - write_replicas peers) and under {PREFIX} (the \
         same entries): {WRITTEN} p50 {:.0} us, p99 {:.0} us; {PREFIX} p50 {:.0} us, p99 {:.0} \
         us ({:.2}x at the median)",
        w.len(),
        us(&w, 0.5),
        us(&w, 0.99),
        us(&d, 0.5),
        us(&d, 0.99),
        us(&w, 0.5) / us(&d, 0.5)
    ));

    match FuseMount::start(&stack.cluster, &work.join("mnt"), None) {
        Ok(mount) => {
            let root = Route::Fs(mount.mp.join(PREFIX.trim_start_matches('/')));
            notes.push(format!("pagefs mounted at {}", mount.mp.display()));
            let r = pass(o, "pagefs-warm", &root, files, &probe(vec![mount.pid]), rt);
            drop(mount);
            paths.push(r?);
        }
        Err(e) => skipped.push(format!("pagefs-warm: not measured: {e:#}")),
    }

    let (key, secret) = ("pagebench", "pagebench-secret");
    let staging = work.join("s3-staging");
    std::fs::create_dir_all(&staging).with_context(|| staging.display().to_string())?;
    let gw = Gateway::start(&stack.cluster, key, secret, &staging)?;
    let bucket = PREFIX.trim_start_matches('/');
    notes.push(format!(
        "pages3 at {} (bucket {bucket}), read with object_store's S3 client",
        gw.endpoint
    ));
    let s3 = frontends::s3_url(
        &gw.endpoint,
        bucket,
        "",
        "us-east-1",
        Some(key),
        Some(secret),
    );
    let s3 = Route::Store {
        table: Arc::new(MountTable::new(&[("/s3".to_string(), s3)])?),
        prefix: "/s3".into(),
    };
    let r = pass(o, "pages3-warm", &s3, files, &probe(vec![gw.pid]), rt);
    drop(gw);
    let _ = std::fs::remove_dir_all(&staging);
    paths.push(r?);
    drop(stack);

    let preload = preload::preload_files(
        o,
        &work.join("preload"),
        data,
        &files.entries,
        Vec::new(),
        rt,
    )?;
    Ok(Outcome {
        notes: std::mem::take(notes),
        skipped,
        paths,
        phases,
        preload,
    })
}

fn opt2(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

fn print_text(
    o: &Opts,
    out: &Outcome,
    files: &Files,
    warning: Option<String>,
    load0: [f64; 3],
    load1: [f64; 3],
) {
    if let Some(w) = &warning {
        println!("{w}");
    }
    for n in &out.notes {
        println!("{n}");
    }
    println!(
        "smallfiles: {} files of {} bytes, each opened, stat'ed and read whole, {} at a time; \
         load average {:.2} before, {:.2} after",
        files.entries.len(),
        o.file_size,
        o.parallel,
        load0[0],
        load1[0]
    );
    println!(
        "{:<12} {:>9} {:>8} {:>8} {:>8} {:>9} {:>6} {:>6} {:>6} {:>7} {:>9}",
        "path",
        "files/s",
        "MB/s",
        "p50 us",
        "p99 us",
        "max us",
        "CPU:b",
        "fe",
        "nodes",
        "hits",
        "vs direct"
    );
    let base = out.paths.first().map_or(f64::NAN, RunResult::iops);
    for r in &out.paths {
        let (b, fe, nd) = r.cpu_per_gb();
        println!(
            "{:<12} {:>9.0} {:>8.1} {:>8.0} {:>8.0} {:>9.0} {:>6.2} {:>6} {:>6} {:>7} {:>8.2}x",
            r.target,
            r.iops(),
            r.bw() / 1e6,
            r.us(0.5),
            r.us(0.99),
            r.hist.max() as f64 / 1e3,
            b,
            opt2(fe),
            opt2(nd),
            r.hit_ratio()
                .map_or("-".into(), |h| format!("{:.1}%", h * 100.0)),
            r.iops() / base
        );
    }
    for (label, p) in &out.phases {
        println!(
            "{label}: per file, open (Client::open: a StatPath at the metadata owner) p50 {:.0} \
             us, p99 {:.0} us; read (read_at: a Fetch at the page's owner) p50 {:.0} us, p99 \
             {:.0} us",
            p.open[0], p.open[1], p.read[0], p.read[1]
        );
    }
    for s in &out.skipped {
        println!("{s}");
    }
    println!(
        "CPU in seconds per GB read: b = this process, fe = the front end, nodes = the \
         pagestored processes; every path read all {} files byte-exact (length and crc32 \
         against the generator)",
        files.entries.len()
    );
    println!();
    out.preload.print();
}

fn print_json(
    o: &Opts,
    out: &Outcome,
    files: &Files,
    warning: Option<String>,
    load0: [f64; 3],
    load1: [f64; 3],
) {
    let base = out.paths.first().map_or(f64::NAN, RunResult::iops);
    let paths: Vec<serde_json::Value> = out
        .paths
        .iter()
        .map(|r| {
            let mut v = r.to_json();
            v["files"] = r.ops.into();
            v["files_per_sec"] = r.iops().into();
            v["vs_direct"] = (r.iops() / base).into();
            if let Some((_, p)) = out.phases.iter().find(|(l, _)| *l == r.target) {
                v["open_us"] = serde_json::json!({"p50": p.open[0], "p99": p.open[1]});
                v["read_us"] = serde_json::json!({"p50": p.read[0], "p99": p.read[1]});
            }
            v
        })
        .collect();
    println!(
        "{}",
        serde_json::json!({
            "mode": "smallfiles",
            "setup": out.notes,
            "files": files.entries.len(),
            "file_size": o.file_size,
            "bytes": files.bytes(),
            "parallel": o.parallel,
            "page_size": o.page_size,
            "nodes": o.nodes.unwrap_or(3),
            "shards": o.shards,
            "load_average": {"before": load0, "after": load1},
            "warning": warning,
            "paths": paths,
            "not_measured": out.skipped,
            "byte_exact": true,
            "preload": out.preload.to_json(),
        })
    );
}
