//! The fio reference: the same access pattern, block size, queue depth and job count, on the same
//! file system, in the same run.

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

/// Runs fio for `workload` (`write`: sequential writes of `o.size` bytes in `o.page_size`
/// blocks to fresh files under `DIR/fio`, `o.shards` jobs `o.qd` deep; otherwise random
/// reads of the engine's cache files).
pub(crate) fn run_fio(o: &Opts, workload: &str) -> Result<FioResult> {
    let per_job = (o.size / o.shards as u64).max(o.page_size as u64);
    let (rw, bs) = match workload {
        "write" => ("write", o.page_size as u64),
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
    if rw == "write" {
        // Writes go to fresh preallocated files of the same size as the engine's data.
        let dir = o.dir.join("fio");
        std::fs::create_dir_all(&dir)?;
        cmd.args([
            "--name=ref",
            &format!("--directory={}", dir.display()),
            &format!("--size={per_job}"),
            &format!("--numjobs={}", o.shards),
        ]);
    } else {
        // Reads go to the very bytes the engine read: one job per shard over the data region of
        // that shard's cache file (same extents, same file system).
        cmd.args([
            "--time_based",
            &format!("--runtime={}", o.seconds.ceil() as u64),
            "--readonly",
        ]);
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
    let out = cmd
        .output()
        .map_err(|e| anyhow!("cannot run fio ({e}); install it (Debian: apt-get install fio)"))?;
    if !out.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("cannot parse fio output")?;
    let dirn = if rw == "write" { "write" } else { "read" };
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

/// The engine first (it leaves its cache files in place), then fio over the same bytes, for
/// every workload.
pub fn compare_results(o: &Opts) -> Result<(Vec<local::WorkloadResult>, Vec<FioResult>)> {
    let results = local::run_local(o)?;
    let mut refs = Vec::new();
    for w in &o.workloads {
        refs.push(run_fio(o, w)?);
    }
    let _ = std::fs::remove_dir_all(o.dir.join("fio"));
    Ok((results, refs))
}

/// [`compare_results`], printed with ratios.
pub fn compare(o: &Opts) -> Result<()> {
    let (results, refs) = compare_results(o)?;
    local::report(o, &results, Some(&refs));
    Ok(())
}
