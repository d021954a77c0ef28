//! `pagebench`: pagestore's benchmark harness.
//!
//! Every speed figure is printed next to a reference measured in the same run (these machines
//! drift from run to run), as a ratio. See docs/BENCHMARKS.md, and `args` for the command line.

mod args;
mod bench;
mod checkpoint;
mod cluster;
mod dataset;
mod fanout;
mod fio;
mod frontends;
mod fusecmp;
mod local;
mod modes;
mod net;
mod preload;
mod pycmp;
mod smallfiles;
mod uring;
mod zipf;

use std::path::PathBuf;

use anyhow::{anyhow, Result};
use pagestore_cli::ClusterArgs;

/// Command-line options shared by the subcommands.
#[derive(Clone, Debug)]
pub struct Opts {
    /// Directory for the cache files (and fio's files, datasets, mounts): a real disk.
    pub dir: PathBuf,
    /// Whether `--dir` was given.
    pub dir_given: bool,
    /// Engine (and cluster) page size.
    pub page_size: u32,
    /// Shards (and fio jobs); shards per node for the cluster targets.
    pub shards: usize,
    /// Requests in flight per shard (engine targets) or per reader (the target modes).
    pub qd: usize,
    /// Whether `--qd` was given.
    pub qd_given: bool,
    /// `compare`: every value of `--qd` (a depth sweep); `qd` is the first.
    pub qd_list: Vec<usize>,
    /// Seconds per read workload.
    pub seconds: f64,
    /// Dataset size in bytes (the target modes: of the flat files).
    pub size: u64,
    /// Whether `--size` was given.
    pub size_given: bool,
    /// Workloads to run.
    pub workloads: Vec<String>,
    /// Whether `--workloads` was given.
    pub workloads_given: bool,
    /// Pages for `restart`.
    pub pages: u64,
    /// Print JSON instead of a table.
    pub json: bool,
    /// Random seed (of the data and of the operation streams).
    pub seed: u64,
    /// `net`: also measure nginx over HTTPS serving the same bytes.
    pub nginx: bool,
    /// Latency added to every under-storage request (emulating a distant store).
    pub ufs_latency_ms: Option<f64>,
    /// Bandwidth of each under-storage request, MB/s (emulating a distant store).
    pub ufs_mbps: Option<f64>,
    /// Readers; each value is a separate run.
    pub readers: Vec<usize>,
    /// Whether `--readers` was given.
    pub readers_given: bool,
    /// Bytes per read of `seq`.
    pub block: u64,
    /// Byte budget per run (instead of, or with, `--seconds`).
    pub bytes: Option<u64>,
    /// Zipf skew.
    pub zipf: Option<f64>,
    /// `fuse`: the dataset root under a mount.
    pub path: Option<PathBuf>,
    /// `ufs`, `gen`: an under-storage URL.
    pub ufs: Option<String>,
    /// `s3`: endpoint URL.
    pub endpoint: Option<String>,
    /// `s3`: bucket.
    pub bucket: Option<String>,
    /// `s3`: key prefix of the dataset; `client`: logical prefix.
    pub prefix: String,
    /// `s3`: access key.
    pub access_key: Option<String>,
    /// `s3`: secret key.
    pub secret_key: Option<String>,
    /// `s3`: region.
    pub region: String,
    /// An external cluster (`--cluster`, `--tls-dir` and the other client options); without
    /// `--cluster` the targets start their own.
    pub cluster: ClusterArgs,
    /// Nodes of a self-contained cluster.
    pub nodes: Option<usize>,
    /// `fuse`: O_DIRECT reads.
    pub direct: bool,
    /// `fuse`: keep the kernel's cached pages between runs.
    pub keep_page_cache: bool,
    /// Self-contained targets: do not warm the cache first.
    pub cold: bool,
    /// `fusecmp`: skip the engine runs.
    pub no_engine: bool,
    /// `scale`: sweep one node's shards through the client library instead of the engine.
    pub scale_client: bool,
    /// Engine targets and `raw`: pin each shard's thread to a CPU (the engine's default).
    pub pin: bool,
    /// Bytes per flat file.
    pub file_size: u64,
    /// Episode files.
    pub episodes: u64,
    /// Seconds per episode.
    pub episode_secs: u32,
    /// Cameras per episode.
    pub cameras: u32,
    /// Mean encoded frame size.
    pub frame_size: u32,
    /// Episode chunk order.
    pub layout: dataset::Layout,
    /// Frames per episode sample.
    pub sample_frames: u32,
    /// Seconds of proprioception per sample.
    pub window_secs: f64,
    /// Small files of the preload manifest.
    pub manifest_files: u64,
    /// Their size.
    pub manifest_file_size: u64,
    /// Check every Nth operation against the generator.
    pub verify_every: u64,
    /// More processes whose CPU time counts as the front end's.
    pub cpu_pids: Vec<u32>,
    /// `pycmp`: the Python interpreter (with the pagestore package and s3fs).
    pub python: Option<PathBuf>,
    /// `pycmp`: rounds of every target over the same cluster (the median round is reported).
    pub rounds: usize,
    /// `checkpoint`: writers (one file each).
    pub writers: usize,
    /// `checkpoint`: the clusters' write replicas (default 1 and 2, as far as the nodes go).
    pub write_replicas: Option<Vec<u8>>,
    /// `smallfiles`: how many files.
    pub small_files: u64,
    /// `smallfiles`: files in flight per path.
    pub parallel: usize,
}

impl Default for Opts {
    fn default() -> Self {
        let ep = dataset::EpisodeSpec::default();
        Opts {
            dir: PathBuf::from("pagebench-data"),
            dir_given: false,
            page_size: 4 << 20,
            shards: std::thread::available_parallelism().map_or(1, |n| n.get()),
            qd: 8,
            qd_given: false,
            qd_list: vec![8],
            seconds: 10.0,
            size: 4 << 30,
            size_given: false,
            workloads: vec!["write".into(), "read".into(), "read4k".into()],
            workloads_given: false,
            pages: 250_000,
            json: false,
            seed: 42,
            nginx: false,
            ufs_latency_ms: None,
            ufs_mbps: None,
            readers: vec![4],
            readers_given: false,
            block: 1 << 20,
            bytes: None,
            zipf: None,
            path: None,
            ufs: None,
            endpoint: None,
            bucket: None,
            prefix: String::new(),
            access_key: None,
            secret_key: None,
            region: "us-east-1".into(),
            cluster: ClusterArgs::default(),
            nodes: None,
            direct: false,
            keep_page_cache: false,
            cold: false,
            no_engine: false,
            scale_client: false,
            pin: true,
            file_size: 64 << 20,
            episodes: ep.count,
            episode_secs: ep.secs,
            cameras: ep.cameras,
            frame_size: ep.frame_bytes,
            layout: ep.layout,
            sample_frames: 4,
            window_secs: 10.0,
            manifest_files: 10_000,
            manifest_file_size: 64 << 10,
            verify_every: 64,
            cpu_pids: Vec::new(),
            python: None,
            rounds: 1,
            writers: 4,
            write_replicas: None,
            small_files: 10_000,
            parallel: 8,
        }
    }
}

impl Opts {
    /// The dataset these options describe.
    pub fn dataset(&self) -> dataset::Dataset {
        dataset::Dataset {
            seed: self.seed,
            files: if self.size == 0 {
                0
            } else {
                (self.size / self.file_size.max(1)).max(1)
            },
            file_size: self.file_size,
            episodes: dataset::EpisodeSpec {
                count: self.episodes,
                secs: self.episode_secs,
                cameras: self.cameras,
                frame_bytes: self.frame_size,
                layout: self.layout,
                ..dataset::EpisodeSpec::default()
            },
            small_files: 0,
            small_size: self.manifest_file_size,
        }
    }

    /// `checkpoint`: the write replicas to run with on `nodes` nodes.
    pub fn replicas_for(&self, nodes: usize) -> Result<Vec<u8>> {
        match &self.write_replicas {
            None => Ok([1u8, 2]
                .into_iter()
                .filter(|&r| usize::from(r) <= nodes)
                .collect()),
            Some(r) => {
                if let Some(big) = r.iter().find(|&&r| usize::from(r) > nodes) {
                    return Err(anyhow!(
                        "--write-replicas {big} needs at least {big} nodes (--nodes {nodes})"
                    ));
                }
                Ok(r.clone())
            }
        }
    }

    /// Operations in flight per reader in the target modes (default 1).
    pub fn reader_qd(&self) -> usize {
        if self.qd_given {
            self.qd
        } else {
            1
        }
    }

    /// The target modes' workloads.
    pub fn new_workloads(&self) -> Result<Vec<bench::Workload>> {
        if !self.workloads_given {
            return bench::WORKLOADS
                .iter()
                .map(|w| bench::Workload::parse(w))
                .collect();
        }
        self.workloads
            .iter()
            .map(|w| bench::Workload::parse(w))
            .collect()
    }
}

/// `compare`: the engine against fio at its best, at every depth of the sweep, and with
/// `preload` the preload job.
fn compare(o: &Opts) -> Result<()> {
    let preload = o.workloads.iter().any(|w| w == "preload");
    let engine = Opts {
        workloads: o
            .workloads
            .iter()
            .filter(|w| *w != "preload")
            .cloned()
            .collect(),
        ..o.clone()
    };
    let depths = if engine.workloads.is_empty() {
        Vec::new()
    } else {
        fio::sweep(&engine)?
    };
    let p = if preload {
        Some(preload::run_preload(o)?)
    } else {
        None
    };
    if o.json {
        let rows = fio::sweep_json(&depths);
        match &p {
            None => println!("{rows}"),
            Some(p) => {
                let mut v = serde_json::json!({"preload": p.to_json()});
                if !depths.is_empty() {
                    v["workloads"] = rows;
                }
                println!("{v}");
            }
        }
    } else {
        if !depths.is_empty() {
            fio::print_sweep(&depths);
        }
        if let Some(p) = &p {
            if !depths.is_empty() {
                println!();
            }
            p.print();
        }
    }
    Ok(())
}

fn main() {
    let (cmd, opts) = match args::parse(std::env::args_os()) {
        Ok(x) => x,
        Err(args::Refused::Clap(e)) => {
            let _ = e.print();
            std::process::exit(if e.use_stderr() { 2 } else { 0 });
        }
        Err(args::Refused::Invalid(e)) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let r = match cmd {
        "local" => local::run_local(&opts).map(|results| local::report(&opts, &results, None)),
        "compare" => compare(&opts),
        "restart" => local::restart(&opts),
        "restart-open" => local::restart_open(&opts),
        "raw" => local::raw(&opts),
        "net" => net::run_net(&opts, opts.nginx),
        "scale" if opts.scale_client => modes::scale_client(&opts),
        "scale" => local::scale(&opts),
        "cluster" => cluster::run_cluster(&opts),
        "fanout" => fanout::run_fanout(&opts),
        "gen" => dataset::run_gen(&opts),
        "ufs" => modes::run_mode(&opts, modes::Mode::Ufs),
        "fuse" => modes::run_mode(&opts, modes::Mode::Fuse),
        "s3" => modes::run_mode(&opts, modes::Mode::S3),
        "client" => modes::run_mode(&opts, modes::Mode::Client),
        "fusecmp" => fusecmp::run_fusecmp(&opts),
        "pycmp" => pycmp::run_pycmp(&opts),
        "checkpoint" => checkpoint::run_checkpoint(&opts),
        "smallfiles" => smallfiles::run_smallfiles(&opts),
        _ => Err(anyhow!("unknown command {cmd}")),
    };
    if let Err(e) = r {
        eprintln!("pagebench: {}", pagestore_cli::error_chain(&e));
        std::process::exit(1);
    }
}
