//! `pagebench`: pagestore's benchmark harness.
//!
//! Every speed figure is printed next to a reference measured in the same run (these machines
//! drift from run to run), as a ratio. See docs/BENCHMARKS.md.
//!
//! ```text
//! pagebench local    [options]   the engine alone: write (insert), read (whole pages), read4k
//! pagebench compare  [options]   the same workloads through fio first, then the engine, with ratios
//! pagebench restart  [options]   fill a cache, restart it, report restart time and memory per page
//! pagebench net      [options]   4 MiB page hits over QUIC from a node's shard endpoints on
//!                                loopback (--nginx: and the same bytes from nginx over HTTPS)
//! pagebench scale    [options]   the local workloads with 1, 2, 4 ... --shards shards: throughput
//!                                per shard, to see whether a machine with more cores scales
//! pagebench raw      [options]   random reads of the cache files with glommio alone (no engine):
//!                                separates the engine's cost from the executor's
//! pagebench cluster  [options]   3 pagestored processes on loopback over a local-directory under
//!                                storage: cold and warm reads through the client against
//!                                object_store straight from the store and the local engine; a
//!                                node SIGKILLed during a scan
//! ```

use pagestore_tools::parse_size;

mod cluster;
mod fio;
mod local;
mod net;

use std::path::PathBuf;

/// Command-line options shared by the subcommands.
#[derive(Clone, Debug)]
pub struct Opts {
    /// Directory for the cache files (and fio's files): must be a real disk file system.
    pub dir: PathBuf,
    /// Engine page size.
    pub page_size: u32,
    /// Shards (and fio jobs).
    pub shards: usize,
    /// Requests in flight per shard (and fio's iodepth per job).
    pub qd: usize,
    /// Seconds per read workload.
    pub seconds: f64,
    /// Dataset size in bytes, split over the shards.
    pub size: u64,
    /// Workloads to run.
    pub workloads: Vec<String>,
    /// Pages for `restart`.
    pub pages: u64,
    /// Print JSON instead of a table.
    pub json: bool,
    /// Random seed.
    pub seed: u64,
    /// `net`: also measure nginx over HTTPS serving the same bytes.
    pub nginx: bool,
    /// `cluster`: latency added to every under-storage request (emulating a distant store).
    pub ufs_latency_ms: Option<f64>,
    /// `cluster`: bandwidth of each under-storage request, MB/s (emulating a distant store).
    pub ufs_mbps: Option<f64>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            dir: PathBuf::from("pagebench-data"),
            page_size: 4 << 20,
            shards: std::thread::available_parallelism().map_or(1, |n| n.get()),
            qd: 8,
            seconds: 10.0,
            size: 4 << 30,
            workloads: vec!["write".into(), "read".into(), "read4k".into()],
            pages: 250_000,
            json: false,
            seed: 42,
            nginx: false,
            ufs_latency_ms: None,
            ufs_mbps: None,
        }
    }
}

const USAGE: &str =
    "usage: pagebench <local|compare|restart|raw|net|scale|cluster> [--dir DIR] [--page-size BYTES] \
[--shards N] [--qd N] [--seconds S] [--size BYTES] [--workloads write,read,read4k] [--pages N] \
[--seed N] [--json] [--nginx] [--ufs-latency-ms MS] [--ufs-mbps MBPS]
sizes take K, M, G suffixes (powers of 1024)";

fn parse(args: &[String]) -> Result<(String, Opts), String> {
    let mut o = Opts::default();
    let cmd = args.first().ok_or(USAGE)?.clone();
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--dir" => o.dir = PathBuf::from(val()?),
            "--page-size" => o.page_size = parse_size(&val()?)? as u32,
            "--shards" => o.shards = val()?.parse().map_err(|e| format!("--shards: {e}"))?,
            "--qd" => o.qd = val()?.parse().map_err(|e| format!("--qd: {e}"))?,
            "--seconds" => o.seconds = val()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--size" => o.size = parse_size(&val()?)?,
            "--pages" => o.pages = val()?.parse().map_err(|e| format!("--pages: {e}"))?,
            "--seed" => o.seed = val()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--workloads" => o.workloads = val()?.split(',').map(str::to_string).collect(),
            "--json" => o.json = true,
            "--nginx" => o.nginx = true,
            "--ufs-latency-ms" => {
                o.ufs_latency_ms = Some(
                    val()?
                        .parse()
                        .map_err(|e| format!("--ufs-latency-ms: {e}"))?,
                )
            }
            "--ufs-mbps" => {
                o.ufs_mbps = Some(val()?.parse().map_err(|e| format!("--ufs-mbps: {e}"))?)
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
    }
    if o.shards == 0 || o.qd == 0 {
        return Err("--shards and --qd must be at least 1".into());
    }
    for w in &o.workloads {
        if !["write", "read", "read4k"].contains(&w.as_str()) {
            return Err(format!("unknown workload {w} (write, read, read4k)"));
        }
    }
    Ok((cmd, o))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, opts) = match parse(&args) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let r = match cmd.as_str() {
        "local" => local::run_local(&opts).map(|results| local::report(&opts, &results, None)),
        "compare" => fio::compare(&opts),
        "restart" => local::restart(&opts),
        "restart-open" => local::restart_open(&opts),
        "raw" => local::raw(&opts),
        "net" => net::run_net(&opts, opts.nginx),
        "scale" => local::scale(&opts),
        "cluster" => cluster::run_cluster(&opts),
        _ => Err(format!("unknown command {cmd}\n{USAGE}")),
    };
    if let Err(e) = r {
        eprintln!("pagebench: {e}");
        std::process::exit(1);
    }
}
