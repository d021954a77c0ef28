//! `pagebench fusecmp` (issue 6): in one run, the same reads through (a) a `pagefs` mount,
//! (b) the client library directly and (c) the engine alone in this process, over the same
//! warm dataset, with the ratios FUSE / client and FUSE / engine. Target: sequential reads
//! through FUSE at least 0.8x the client library.
//!
//! - The dataset (flat files) is written under `DIR/dataset`; a local cluster (`--nodes`,
//!   default 1, `--shards` shards each) mounts it and every page is loaded before measuring.
//! - FUSE: sequential reads are buffered, as `dd` or a training loop does them (the kernel's
//!   read-ahead in front of pagefs; each file's cached pages are dropped before each run);
//!   `--direct` makes them O_DIRECT. Random reads always use O_DIRECT, so every read reaches
//!   pagefs instead of being served again from the kernel's page cache.
//! - Client: sequential reads through a `FileHandle` (the client's read-ahead), random reads
//!   with `read_at`.
//! - Engine: the same pages, put into a fresh engine in this process (`DIR/fusecmp/engine`),
//!   read through its shard handles; sequential reads keep as many bytes in flight as the
//!   client's read-ahead does.
//! - Every run checks a sample of its reads against the generator, and a fixed set of ranges
//!   is read through all three paths and compared by crc32.

use std::{collections::BTreeMap, os::unix::fs::FileExt, sync::Arc};

use anyhow::{anyhow, bail, Context as _, Result};
use pagestore_client::ClientOptions;
use pagestore_engine::{format::Geometry, Engine, EngineConfig};

use crate::{
    bench::{self, AsyncTarget, Catalog, FsTarget, Probe, RunResult, Spec, Target, Workload},
    frontends::{FuseMount, PREFIX},
    modes::{load_warning, loadavg, local_stack},
    Opts,
};

/// Target for sequential reads: FUSE / client library.
pub const SEQ_TARGET: f64 = 0.8;

/// The ranges read through every path for the checksum comparison: per file (at most 64
/// files), the first 64 KiB, 1 MiB from the middle, and the last 100,000 bytes (unaligned).
pub fn sample_ranges(cat: &Catalog) -> Vec<(usize, u64, u64)> {
    let mut v = Vec::new();
    for (i, e) in cat.files[..cat.flat].iter().enumerate().take(64) {
        let s = e.size;
        v.push((i, 0, s.min(64 << 10)));
        let mid = s / 2 / 4096 * 4096;
        v.push((i, mid, (s - mid).min(1 << 20)));
        let tail = s.min(100_000);
        v.push((i, s - tail, tail));
    }
    v.retain(|r| r.2 > 0);
    v
}

fn crc_fs(fs: &FsTarget, cat: &Catalog, ranges: &[(usize, u64, u64)]) -> Result<Vec<u32>> {
    ranges
        .iter()
        .map(|&(f, off, len)| {
            let path = fs.root.join(&cat.files[f].rel);
            let file = std::fs::File::open(&path).with_context(|| path.display().to_string())?;
            let mut buf = vec![0u8; len as usize];
            file.read_exact_at(&mut buf, off)
                .with_context(|| path.display().to_string())?;
            Ok(crc32fast::hash(&buf))
        })
        .collect()
}

fn crc_async(
    t: &AsyncTarget,
    cat: &Catalog,
    ranges: &[(usize, u64, u64)],
    rt: &tokio::runtime::Runtime,
) -> Result<Vec<u32>> {
    rt.block_on(async {
        let mut out = Vec::new();
        for &(f, off, len) in ranges {
            let b = t.read(cat, f, off, len).await?;
            out.push(crc32fast::hash(&b));
        }
        Ok(out)
    })
}

pub fn crc_expected(cat: &Catalog, ranges: &[(usize, u64, u64)]) -> Vec<u32> {
    ranges
        .iter()
        .map(|&(f, off, len)| {
            let mut buf = vec![0u8; len as usize];
            crate::dataset::fill(cat.files[f].key, off, &mut buf);
            crc32fast::hash(&buf)
        })
        .collect()
}

fn compare(
    name: &str,
    got: &[u32],
    want: &[u32],
    ranges: &[(usize, u64, u64)],
    cat: &Catalog,
) -> Result<()> {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if g != w {
            let (f, off, len) = ranges[i];
            bail!(
                "checksum mismatch through {name}: {} bytes {off}..{} (crc32 {g:08x}, the \
                 generator's {w:08x})",
                cat.files[f].rel,
                off + len
            );
        }
    }
    Ok(())
}

/// The engine over the same pages.
fn start_engine(o: &Opts, cat: &Catalog) -> Result<Engine> {
    let page = u64::from(o.page_size);
    let dir = o.dir.join("fusecmp").join("engine");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let pages: u64 = cat.files.iter().map(|e| e.size.div_ceil(page)).sum();
    let shards = o.shards.max(1) as u64;
    let per_shard = pages.div_ceil(shards) * 3 / 2 + 4;
    let per_shard =
        u32::try_from(per_shard).map_err(|_| anyhow!("too many pages for the engine"))?;
    let geo = Geometry::new(o.page_size, 4096, per_shard);
    Engine::start(EngineConfig {
        cache_dirs: vec![dir],
        capacity: geo.file_size * shards,
        page_size: o.page_size,
        shards: o.shards,
        queue_depth: o.qd,
        reformat: true,
        ..Default::default()
    })
    .context("engine")
}

/// Sample ranges: (file, offset, length).
type Ranges = Vec<(usize, u64, u64)>;

/// One cell of the comparison.
struct Cell {
    workload: Workload,
    readers: usize,
    fuse: usize,
    client: usize,
    engine: Option<usize>,
}

/// The spec of one cell: the options' spec for `w` and `r`, one read in flight per reader.
fn cell_spec(o: &Opts, w: Workload, r: usize) -> Spec {
    Spec {
        qd: 1,
        ..Spec::from_opts(o, w, r, u64::from(o.page_size))
    }
}

/// What the runs produced, for the report.
struct Outcome {
    warning: Option<String>,
    load0: [f64; 3],
    load1: [f64; 3],
    notes: Vec<String>,
    engine_note: Option<String>,
    cells: Vec<Cell>,
    results: Vec<RunResult>,
    ranges: Vec<(usize, u64, u64)>,
}

/// Runs the comparison.
pub fn run_fusecmp(o: &Opts) -> Result<()> {
    let workloads: Vec<Workload> = if o.workloads_given {
        o.new_workloads()?
    } else {
        vec![
            Workload::Seq,
            Workload::Rand(4096),
            Workload::Rand(128 << 10),
        ]
    };
    let readers = if o.readers_given {
        o.readers.clone()
    } else {
        vec![1, 8]
    };
    let warning = load_warning();
    let load0 = loadavg();
    let rt = bench::runtime(2)?;
    let mut ds = o.dataset();
    if !workloads.contains(&Workload::Episodes) {
        ds.episodes.count = 0;
    }
    ds.small_files = 0;
    let mut notes = Vec::new();
    let mut results: Vec<RunResult> = Vec::new();
    let (cat, mut cells, ranges, want) =
        run_stack(o, &ds, &workloads, &readers, &rt, &mut notes, &mut results)?;
    let engine_note = if o.no_engine {
        Some("engine runs skipped (--no-engine)".to_string())
    } else {
        run_engine(
            o,
            &cat,
            &ranges,
            &want,
            &mut cells,
            &rt,
            &mut notes,
            &mut results,
        )?;
        None
    };
    let out = Outcome {
        warning,
        load0,
        load1: loadavg(),
        notes,
        engine_note,
        cells,
        results,
        ranges,
    };
    if o.json {
        print_json(&out, &cat);
    } else {
        print_text(&out, &cat, u64::from(o.page_size));
    }
    Ok(())
}

/// The FUSE and client runs of every cell, on a local cluster with a pagefs mount, and the
/// checksum comparison through both paths; the cluster and mount are gone on return.
/// Returns the catalog, the cells (engine runs not yet done), the sample ranges and their
/// expected checksums.
#[allow(clippy::type_complexity)]
fn run_stack(
    o: &Opts,
    ds: &crate::dataset::Dataset,
    workloads: &[Workload],
    readers: &[usize],
    rt: &tokio::runtime::Runtime,
    notes: &mut Vec<String>,
    results: &mut Vec<RunResult>,
) -> Result<(Arc<Catalog>, Vec<Cell>, Vec<(usize, u64, u64)>, Vec<u32>)> {
    let so = Opts {
        nodes: Some(o.nodes.unwrap_or(1)),
        cold: false,
        ..o.clone()
    };
    let (stack, cat) = local_stack(&so, "fusecmp", ds, rt, notes)?;
    let mount = FuseMount::start(&stack.cluster, &o.dir.join("fusecmp").join("mnt"), None)?;
    let root = mount.mp.join(PREFIX.trim_start_matches('/'));
    let buffered = FsTarget {
        root: root.clone(),
        direct: o.direct,
        drop_cache: true,
    };
    buffered.check(&cat)?;
    let fs_seq = Target::Fs(Arc::new(buffered.clone()));
    let fs_rand = Target::Fs(Arc::new(FsTarget {
        direct: true,
        ..buffered.clone()
    }));
    let infos = rt.block_on(bench::stat_all(&cat, PREFIX, |p| {
        let c = stack.client.clone();
        async move { Ok(c.stat(&p).await?) }
    }))?;
    let client_t = Arc::new(AsyncTarget::Client {
        client: stack.client.clone(),
        infos,
    });
    notes.push(format!(
        "pagefs mounted at {}; FUSE sequential reads {}, random reads O_DIRECT",
        mount.mp.display(),
        if o.direct {
            "O_DIRECT"
        } else {
            "buffered (kernel read-ahead)"
        }
    ));
    let probe_fuse = Probe {
        counters: Some(stack.client.clone()),
        nodes: stack.pids(),
        frontend: vec![mount.pid],
    };
    let probe_client = Probe {
        frontend: Vec::new(),
        ..probe_fuse.clone()
    };
    let mut cells = Vec::new();
    for &w in workloads {
        for &r in readers {
            let spec = cell_spec(o, w, r);
            let fs = if w == Workload::Seq {
                &fs_seq
            } else {
                &fs_rand
            };
            results.push(bench::run("fuse", fs, &cat, &spec, &probe_fuse, rt)?);
            let fuse = results.len() - 1;
            results.push(bench::run(
                "client",
                &Target::Async(client_t.clone()),
                &cat,
                &spec,
                &probe_client,
                rt,
            )?);
            cells.push(Cell {
                workload: w,
                readers: r,
                fuse,
                client: results.len() - 1,
                engine: None,
            });
        }
    }
    let (ranges, want) = check_fuse_and_client(&buffered, &client_t, &cat, rt)?;
    drop(mount);
    drop(stack);
    Ok((cat, cells, ranges, want))
}

/// Reads the sample ranges through FUSE and the client library and compares them with the
/// generator's bytes; returns the ranges and their expected checksums.
fn check_fuse_and_client(
    buffered: &FsTarget,
    client_t: &AsyncTarget,
    cat: &Catalog,
    rt: &tokio::runtime::Runtime,
) -> Result<(Ranges, Vec<u32>)> {
    let ranges = sample_ranges(cat);
    let want = crc_expected(cat, &ranges);
    compare(
        "FUSE",
        &crc_fs(buffered, cat, &ranges)?,
        &want,
        &ranges,
        cat,
    )?;
    compare(
        "the client library",
        &crc_async(client_t, cat, &ranges, rt)?,
        &want,
        &ranges,
        cat,
    )?;
    Ok((ranges, want))
}

/// The engine run of every cell, in a fresh engine in this process filled with the same
/// pages, and the checksum comparison through it.
#[allow(clippy::too_many_arguments)]
fn run_engine(
    o: &Opts,
    cat: &Arc<Catalog>,
    ranges: &[(usize, u64, u64)],
    want: &[u32],
    cells: &mut [Cell],
    rt: &tokio::runtime::Runtime,
    notes: &mut Vec<String>,
    results: &mut Vec<RunResult>,
) -> Result<()> {
    let page = u64::from(o.page_size);
    let engine = start_engine(o, cat)?;
    let data = o.dir.join("dataset");
    let t0 = std::time::Instant::now();
    let et = Arc::new(AsyncTarget::fill_engine(&engine, cat, &data, rt)?);
    notes.push(format!(
        "engine: {} shard(s) in this process, filled with the same pages in {:.1} s",
        o.shards,
        t0.elapsed().as_secs_f64()
    ));
    let depth = (ClientOptions::default().readahead as u64 * page / o.block.max(1)).max(1);
    for c in cells.iter_mut() {
        let mut spec = cell_spec(o, c.workload, c.readers);
        if c.workload == Workload::Seq {
            spec.qd = depth as usize;
        }
        results.push(bench::run(
            "engine",
            &Target::Async(et.clone()),
            cat,
            &spec,
            &Probe::default(),
            rt,
        )?);
        c.engine = Some(results.len() - 1);
    }
    compare(
        "the engine",
        &crc_async(&et, cat, ranges, rt)?,
        want,
        ranges,
        cat,
    )?;
    drop(et);
    engine.shutdown().context("engine shutdown")?;
    let _ = std::fs::remove_dir_all(o.dir.join("fusecmp").join("engine"));
    Ok(())
}

fn ratio(a: &RunResult, b: &RunResult) -> f64 {
    a.bw() / b.bw().max(1e-9)
}

impl Outcome {
    /// FUSE / client for the sequential cells, by readers.
    fn seq_ratios(&self) -> BTreeMap<usize, f64> {
        let mut seq_ratios = BTreeMap::new();
        for c in &self.cells {
            if c.workload == Workload::Seq {
                seq_ratios.insert(
                    c.readers,
                    ratio(&self.results[c.fuse], &self.results[c.client]),
                );
            }
        }
        seq_ratios
    }

    fn checked_bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.2).sum()
    }
}

fn print_json(out: &Outcome, cat: &Catalog) {
    let results = &out.results;
    let seq_ratios = out.seq_ratios();
    let met = seq_ratios.values().all(|&r| r >= SEQ_TARGET);
    let cells_json: Vec<_> = out
        .cells
        .iter()
        .map(|c| {
            let (f, cl) = (&results[c.fuse], &results[c.client]);
            let e = c.engine.map(|i| &results[i]);
            serde_json::json!({
                "workload": c.workload.name(), "readers": c.readers,
                "fuse_bytes_per_sec": f.bw(), "client_bytes_per_sec": cl.bw(),
                "engine_bytes_per_sec": e.map(RunResult::bw),
                "fuse_over_client": ratio(f, cl),
                "fuse_over_engine": e.map(|e| ratio(f, e)),
                "p99_us": {"fuse": f.us(0.99), "client": cl.us(0.99),
                           "engine": e.map(|e| e.us(0.99))},
            })
        })
        .collect();
    println!(
        "{}",
        serde_json::json!({
            "mode": "fusecmp",
            "setup": out.notes,
            "dataset": cat.ds.to_json(),
            "load_average": {"before": out.load0, "after": out.load1},
            "warning": out.warning,
            "cells": cells_json,
            "sequential_target": {"fuse_over_client_min": SEQ_TARGET,
                "ratios": seq_ratios.iter().map(|(r, v)| serde_json::json!({"readers": r, "fuse_over_client": v})).collect::<Vec<_>>(),
                "met": met},
            "checksums": {"ranges": out.ranges.len(), "bytes": out.checked_bytes(),
                "paths": if out.engine_note.is_some() { vec!["fuse", "client"] } else { vec!["fuse", "client", "engine"] },
                "equal_to_generator": true},
            "runs": results.iter().map(RunResult::to_json).collect::<Vec<_>>(),
        })
    );
}

fn print_text(out: &Outcome, cat: &Catalog, page: u64) {
    let results = &out.results;
    if let Some(w) = &out.warning {
        println!("{w}");
    }
    println!(
        "fusecmp: the same reads through a pagefs mount, the client library and the local \
         engine; {} files, {:.2} GB, {} KiB pages",
        cat.flat,
        cat.flat_bytes() as f64 / 1e9,
        page >> 10
    );
    for n in out.notes.iter().chain(out.engine_note.iter()) {
        println!("{n}");
    }
    println!(
        "load average {:.2} before, {:.2} after",
        out.load0[0], out.load1[0]
    );
    println!(
        "\n{:<9} {:>3} {:>10} {:>10} {:>10} {:>11} {:>11} {:>10} {:>10} {:>10}",
        "workload",
        "rd",
        "FUSE MB/s",
        "client",
        "engine",
        "FUSE/client",
        "FUSE/engine",
        "p99us FUSE",
        "client",
        "engine"
    );
    for c in &out.cells {
        let (f, cl) = (&results[c.fuse], &results[c.client]);
        let e = c.engine.map(|i| &results[i]);
        let opt = |v: Option<f64>, prec: usize| v.map_or("-".into(), |v| format!("{v:.prec$}"));
        println!(
            "{:<9} {:>3} {:>10.1} {:>10.1} {:>10} {:>10.2}x {:>10}x {:>10.0} {:>10.0} {:>10}",
            c.workload.name(),
            c.readers,
            f.bw() / 1e6,
            cl.bw() / 1e6,
            opt(e.map(|e| e.bw() / 1e6), 1),
            ratio(f, cl),
            opt(e.map(|e| ratio(f, e)), 2),
            f.us(0.99),
            cl.us(0.99),
            opt(e.map(|e| e.us(0.99)), 0),
        );
    }
    let seq_ratios = out.seq_ratios();
    let met = seq_ratios.values().all(|&r| r >= SEQ_TARGET);
    if !seq_ratios.is_empty() {
        println!(
            "\nsequential FUSE / client: {} (target >= {SEQ_TARGET}x): {}",
            seq_ratios
                .iter()
                .map(|(r, v)| format!("{r} reader(s) {v:.2}x"))
                .collect::<Vec<_>>()
                .join(", "),
            if met { "met" } else { "NOT met" }
        );
    }
    println!(
        "checksums: {} ranges ({:.1} MB) read through FUSE, the client library{}: identical, \
         and equal to the generator's bytes",
        out.ranges.len(),
        out.checked_bytes() as f64 / 1e6,
        if out.engine_note.is_some() {
            ""
        } else {
            " and the engine"
        }
    );
    println!("\nevery run:");
    bench::print_table(results);
}
