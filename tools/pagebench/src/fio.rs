//! The fio reference: the same access pattern, block size, queue depth and job count, on the same
//! file system, in the same run.
//!
//! fio at its best (issue 15): every reference is run twice, with fio's io_uring defaults and
//! with `--fixedbufs --registerfiles` (buffers and files registered with the ring, as the
//! engine's are), and the faster of the two is the reference. Both are reported.

use std::process::Command;

use crate::{local, Opts};
use anyhow::{anyhow, bail, Context as _, Result};

/// What fio measured for one workload.
pub struct FioResult {
    /// Bytes per second.
    pub bw: f64,
    /// Operations per second.
    pub iops: f64,
    /// Completion latency percentiles, microseconds.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
}

impl FioResult {
    /// JSON form.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"bytes_per_sec": self.bw, "iops": self.iops,
            "latency_us": {"p50": self.p50_us, "p90": self.p90_us, "p99": self.p99_us}})
    }
}

/// How fio is run (always `--ioengine=io_uring --direct=1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// fio's io_uring defaults.
    Plain,
    /// `--fixedbufs --registerfiles`: I/O buffers and files registered with the ring.
    Registered,
}

impl Variant {
    /// Both, in the order they run.
    pub const BOTH: [Variant; 2] = [Variant::Plain, Variant::Registered];

    /// The extra fio options.
    pub fn args(self) -> &'static [&'static str] {
        match self {
            Variant::Plain => &[],
            Variant::Registered => &["--fixedbufs", "--registerfiles"],
        }
    }

    /// Its name in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Plain => "plain",
            Variant::Registered => "fixedbufs_registerfiles",
        }
    }

    /// Its short name in tables.
    pub fn short(self) -> &'static str {
        match self {
            Variant::Plain => "plain",
            Variant::Registered => "fb+rf",
        }
    }
}

/// One reference run both ways; the faster is the reference.
pub struct FioBest {
    /// fio's defaults.
    pub plain: FioResult,
    /// `--fixedbufs --registerfiles`.
    pub registered: FioResult,
}

impl FioBest {
    /// The variant taken: the one with more bytes per second (ties: plain).
    pub fn taken(&self) -> Variant {
        if self.registered.bw > self.plain.bw {
            Variant::Registered
        } else {
            Variant::Plain
        }
    }

    /// The result of `v`.
    pub fn get(&self, v: Variant) -> &FioResult {
        match v {
            Variant::Plain => &self.plain,
            Variant::Registered => &self.registered,
        }
    }

    /// The reference: the faster run.
    pub fn best(&self) -> &FioResult {
        self.get(self.taken())
    }

    /// JSON: both runs and which was taken.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            Variant::Plain.name(): self.plain.to_json(),
            Variant::Registered.name(): self.registered.to_json(),
            "taken": self.taken().name(),
        })
    }
}

/// Runs `one` for both variants, plain first, and keeps both.
pub fn best_of(mut one: impl FnMut(Variant) -> Result<FioResult>) -> Result<FioBest> {
    Ok(FioBest {
        plain: one(Variant::Plain)?,
        registered: one(Variant::Registered)?,
    })
}

/// Runs a prepared fio command (`--output-format=json`) and reads the `dirn` ("read" or
/// "write") side of its first job (with `--group_reporting`, all jobs).
fn exec(mut cmd: Command, dirn: &str) -> Result<FioResult> {
    let out = cmd
        .output()
        .map_err(|e| anyhow!("cannot run fio ({e}); install it (Debian: apt-get install fio)"))?;
    if !out.status.success() {
        bail!(
            "fio failed: {}{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("cannot parse fio output")?;
    let j = &v["jobs"][0][dirn];
    let pct = |p: &str| j["clat_ns"]["percentile"][p].as_f64().unwrap_or(0.0) / 1000.0;
    Ok(FioResult {
        bw: j["bw_bytes"].as_f64().unwrap_or(0.0),
        iops: j["iops"].as_f64().unwrap_or(0.0),
        p50_us: pct("50.000000"),
        p90_us: pct("90.000000"),
        p99_us: pct("99.000000"),
    })
}

/// Runs fio for `workload` the `variant` way:
///
/// - `write`: sequential writes of `o.size` bytes in `o.page_size` blocks to fresh files under
///   `DIR/fio` (removed first), `o.shards` jobs `o.qd` deep;
/// - `write-full`: sequential overwrites of the engine's own cache files, one job per shard
///   over its data region (where an engine whose cache is full writes each evicting insert);
/// - otherwise random reads of the engine's cache files, one job per shard over its data
///   region, for `o.seconds`.
pub(crate) fn run_fio(o: &Opts, workload: &str, variant: Variant) -> Result<FioResult> {
    let per_job = (o.size / o.shards as u64).max(o.page_size as u64);
    let (rw, bs) = match workload {
        "write" | "write-full" => ("write", o.page_size as u64),
        "read" => ("randread", o.page_size as u64),
        _ => ("randread", 4096),
    };
    let mut cmd = Command::new("fio");
    cmd.args([
        "--direct=1",
        "--ioengine=io_uring",
        &format!("--rw={rw}"),
        &format!("--bs={bs}"),
        &format!("--iodepth={}", o.qd),
        "--group_reporting",
        "--output-format=json",
        &format!("--randseed={}", o.seed),
    ]);
    cmd.args(variant.args());
    if workload == "write" {
        // Writes go to fresh preallocated files of the same size as the engine's data (fresh
        // for each variant: overwriting the files of the previous run would be cheaper).
        let dir = o.dir.join("fio");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
        cmd.args([
            "--name=ref",
            &format!("--directory={}", dir.display()),
            &format!("--size={per_job}"),
            &format!("--numjobs={}", o.shards),
        ]);
    } else {
        // Reads (and overwrites) go to the very bytes the engine used: one job per shard over
        // the data region of that shard's cache file (same extents, same file system).
        if rw == "randread" {
            cmd.args([
                "--time_based",
                &format!("--runtime={}", o.seconds.ceil() as u64),
                "--readonly",
            ]);
        }
        let pages = (o.size / o.shards as u64 / o.page_size as u64).max(1);
        let geo = pagestore_engine::format::Geometry::new(o.page_size, 4096, pages as u32);
        for shard in 0..o.shards {
            let file = pagestore_engine::shard_file(&o.dir.join("engine"), shard);
            cmd.args([
                format!("--name=shard{shard}"),
                format!("--filename={}", file.display()),
                format!("--offset={}", geo.data_off),
                format!("--size={}", pages * o.page_size as u64),
            ]);
        }
    }
    let dirn = if rw == "write" { "write" } else { "read" };
    exec(cmd, dirn)
}

/// The engine first (it leaves its cache files in place), then fio over the same bytes, both
/// ways, for every workload.
pub fn compare_results(o: &Opts) -> Result<(Vec<local::WorkloadResult>, Vec<FioBest>)> {
    let results = local::run_local(o)?;
    let mut refs = Vec::new();
    for w in &o.workloads {
        refs.push(best_of(|v| run_fio(o, w, v))?);
    }
    let _ = std::fs::remove_dir_all(o.dir.join("fio"));
    Ok((results, refs))
}

/// The queue depths `compare` runs: `--qd` (one value or a list), else 1, 8 and 32.
pub fn depths(o: &Opts) -> Vec<usize> {
    if o.qd_given {
        o.qd_list.clone()
    } else {
        DEFAULT_DEPTHS.to_vec()
    }
}

/// The depths per shard `compare` sweeps without `--qd` (issue 15).
pub const DEFAULT_DEPTHS: [usize; 3] = [1, 8, 32];

/// One depth of a sweep: its options, the engine's results and fio's.
pub struct Depth {
    /// The options at this depth (`qd` set).
    pub opts: Opts,
    /// The engine.
    pub results: Vec<local::WorkloadResult>,
    /// fio, both ways, per workload.
    pub refs: Vec<FioBest>,
}

/// [`compare_results`] at every depth of [`depths`].
pub fn sweep(o: &Opts) -> Result<Vec<Depth>> {
    depths(o)
        .into_iter()
        .map(|qd| {
            let opts = Opts {
                qd,
                qd_list: vec![qd],
                ..o.clone()
            };
            let (results, refs) = compare_results(&opts)?;
            Ok(Depth {
                opts,
                results,
                refs,
            })
        })
        .collect()
}

/// The issue-15 target for `workload` at depth `qd` (engine / the faster fio), if it sets one.
pub fn target(workload: &str, qd: usize) -> Option<f64> {
    match workload {
        "read4k" if qd >= 8 => Some(0.9),
        "read" => Some(0.95),
        "write" | "write-full" => Some(0.9),
        _ => None,
    }
}

/// The sweep as one JSON array of rows (each with its `qd`).
pub fn sweep_json(depths: &[Depth]) -> serde_json::Value {
    let mut rows = Vec::new();
    for d in depths {
        if let serde_json::Value::Array(v) = local::report_json(&d.opts, &d.results, Some(&d.refs))
        {
            rows.extend(v);
        }
    }
    serde_json::Value::Array(rows)
}

/// Prints every depth's table, then one summary of the ratios by depth.
pub fn print_sweep(depths: &[Depth]) {
    for d in depths {
        local::report(&d.opts, &d.results, Some(&d.refs));
        println!();
    }
    println!(
        "engine / fio at its best (the faster of plain and --fixedbufs --registerfiles), by \
         queue depth per shard:"
    );
    println!(
        "{:<10} {:>4} {:>5} {:>10} {:>10} {:>10} {:>6} {:>7} {:>7}",
        "workload", "qd", "unit", "engine", "fio plain", "fio fb+rf", "taken", "ratio", "target"
    );
    for d in depths {
        for (r, f) in d.results.iter().zip(&d.refs) {
            // 4 KiB reads in IOPS, the rest in MB/s.
            let (unit, e, p, g) = if r.name == "read4k" {
                ("IOPS", r.iops(), f.plain.iops, f.registered.iops)
            } else {
                (
                    "MB/s",
                    r.bw() / 1e6,
                    f.plain.bw / 1e6,
                    f.registered.bw / 1e6,
                )
            };
            let ratio = r.bw() / f.best().bw;
            let target = target(&r.name, d.opts.qd).map_or("-".to_string(), |t| {
                format!("{}{t}", if ratio >= t { ">=" } else { "< " })
            });
            println!(
                "{:<10} {:>4} {:>5} {:>10.0} {:>10.0} {:>10.0} {:>6} {:>7.3} {:>7}",
                r.name,
                d.opts.qd,
                unit,
                e,
                p,
                g,
                f.taken().short(),
                ratio,
                target
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(bw: f64) -> FioResult {
        FioResult {
            bw,
            iops: bw / 4096.0,
            p50_us: 1.0,
            p90_us: 2.0,
            p99_us: 3.0,
        }
    }

    #[test]
    fn the_faster_variant_is_the_reference() {
        let b = FioBest {
            plain: r(100.0),
            registered: r(120.0),
        };
        assert_eq!(b.taken(), Variant::Registered);
        assert_eq!(b.best().bw, 120.0);
        let b = FioBest {
            plain: r(100.0),
            registered: r(90.0),
        };
        assert_eq!(b.taken(), Variant::Plain);
        let j = b.to_json();
        assert_eq!(j["taken"], "plain");
        assert_eq!(j["fixedbufs_registerfiles"]["bytes_per_sec"], 90.0);
        assert_eq!(
            Variant::Registered.args(),
            ["--fixedbufs", "--registerfiles"]
        );
    }

    #[test]
    fn targets_follow_the_issue() {
        assert_eq!(target("read4k", 1), None);
        assert_eq!(target("read4k", 8), Some(0.9));
        assert_eq!(target("read4k", 32), Some(0.9));
        assert_eq!(target("read", 1), Some(0.95));
        assert_eq!(target("write-full", 8), Some(0.9));
    }
}
