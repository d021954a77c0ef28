//! pagebench's command line: one clap subcommand per command, each taking the options that apply
//! to it. The options every command takes are [`Common`]; the others sit in the command's own
//! struct, so an option given to a command that does not take it is refused (with the commands
//! that do take it named, see [`parse`]).

use std::{ffi::OsString, path::PathBuf};

use anyhow::{anyhow, bail, Result};
use clap::{
    error::{ContextKind, ContextValue},
    Args, CommandFactory, FromArgMatches, Parser, Subcommand,
};
use pagestore_cli::{parse_size, ClusterArgs};

use crate::{dataset, Opts};

/// pagestore's benchmark harness: every speed figure is printed next to a reference measured in
/// the same run, as a ratio.
///
/// Engine and network commands (local, compare, restart, net, scale, raw, cluster) measure the
/// engine, its network layer or a local cluster against fio or nginx in the same run. Target
/// commands (gen, ufs, fuse, s3, client, fusecmp) run the same workloads through each front door;
/// without a target, each starts a local cluster over DIR/dataset, warms it, and its front end.
/// `pagebench COMMAND --help` lists a command's options; see docs/BENCHMARKS.md.
#[derive(Parser, Debug)]
#[command(
    name = "pagebench",
    override_usage = "pagebench COMMAND [OPTIONS]",
    // An option given twice takes its last value, as before clap.
    args_override_self = true,
    after_help = "Sizes take K, M, G, T suffixes (powers of 1024)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// The engine alone: write (insert), read (whole pages), read4k
    Local(Plain),

    /// The same workloads through the engine, then fio at its best, with ratios
    ///
    /// The same workloads through the engine, then fio at its best, with ratios: write
    /// (inserts), write-full (inserts into a full cache: every insert evicts), read (whole
    /// pages), read4k; each at every --qd depth per shard (a list; default 1,8,32). fio runs
    /// each reference plain and with --fixedbufs --registerfiles and takes the faster; both
    /// are printed. --workloads preload: a pagectl load of a generated --manifest-files
    /// manifest (time to the first page and to completion) against the UFS read and disk write
    /// bandwidths.
    Compare(Compare),

    /// Fill a cache, restart it, report restart time and memory per page
    Restart(Restart),

    /// The measured half of restart (run by restart in a fresh process)
    #[command(hide = true)]
    RestartOpen(Restart),

    /// Random reads of the cache files with glommio alone (no engine), then on an io_uring each
    /// thread drives itself (tuned and plain)
    Raw(Plain),

    /// 4 MiB page hits over QUIC from a node's shard endpoints on loopback (--nginx: and the
    /// same bytes from nginx over HTTPS)
    Net(Net),

    /// The local workloads with 1, 2, 4 ... --shards shards (--client: the client library
    /// against one node with that many shards, warm, per shard count)
    Scale(Plain),

    /// --nodes (default 3) pagestored processes over a local-directory under storage
    ///
    /// --nodes (default 3) pagestored processes over a local-directory under storage: cold and
    /// warm reads through the client against object_store and the local engine; the last node
    /// SIGKILLed during a scan.
    Cluster(Plain),

    /// Issue 18: one file read whole by many readers over 3 pagestored processes
    ///
    /// Issue 18: one file of --size (default 2G) read whole by each of --readers readers
    /// (default 8,32) over 3 pagestored processes behind an emulated distant store
    /// (--ufs-latency-ms, default 20; --ufs-mbps, default 25), cold and warm, without and with
    /// the memory tier, against every reader reading the store directly; store bytes read,
    /// completion time ratios, per-node bytes served max/mean, and memory-tier against disk
    /// hits for one shard with CPU per GB.
    Fanout(Plain),

    /// Write the dataset (flat files, episode files) to --dir DIR or --ufs URL
    Gen(Gen),

    /// object_store straight to the under storage (--ufs URL; default DIR/dataset): the no-cache
    /// baseline
    Ufs(Ufs),

    /// Plain files under --path DIR (the dataset root, e.g. MOUNT/bench of a pagefs mount);
    /// without --path: pagefs mounted at DIR/fuse/mnt
    Fuse(Fuse),

    /// An S3 endpoint with object_store's S3 client (--endpoint URL --bucket B); without
    /// --endpoint: pages3 in front of the local cluster
    S3(S3),

    /// The client library (--cluster FILE|ADDR); without --cluster: the local cluster
    Client(Client),

    /// Issue 6: seq, rand4k and rand128k through a pagefs mount, the client library and the
    /// local engine
    ///
    /// Issue 6: seq, rand4k and rand128k with 1 and 8 readers through a pagefs mount, the client
    /// library and the local engine over the same warm dataset; ratios FUSE/client and
    /// FUSE/engine; checksums compared.
    Fusecmp(Fusecmp),

    /// Issue 19: Python readers: native fsspec, s3fs over pages3 and pagefs, against the Rust
    /// client
    ///
    /// Issue 19: seq (whole files in --block reads, default 4 MiB) and rand128k, each by
    /// --readers (default 8) Python worker processes through the native fsspec file system
    /// (pagestore://), s3fs over pages3 and a pagefs mount, and by the Rust client library with
    /// as many readers, over the same warm local cluster (--nodes, default 1); ratios native /
    /// client and native / s3fs; sample ranges checked through every Python target.
    Pycmp(Pycmp),
    /// Issue 17: a checkpoint written through the write-back path against writing it straight
    /// to an emulated distant store
    ///
    /// Issue 17: a checkpoint of --size bytes from --writers writers (one file each, 4 MiB
    /// writes, then close) written straight to an emulated distant store (--ufs-latency-ms,
    /// default 20, --ufs-mbps, default 25 per request) and to a local directory with
    /// object_store, and with fio (O_DIRECT); then through the client library and a pagefs
    /// mount to write=back mounts of --nodes real pagestored with each --write-replicas: the
    /// time the writers are blocked, throughput, CPU per GB, and the flush to the store, with
    /// ratios.
    Checkpoint(Checkpoint),

    /// Issue 15: many small files opened, stat'ed and read whole through the client library,
    /// pagefs and pages3 against object_store directly, and their preload
    ///
    /// Issue 15: --files small files of --file-size (default 10000 of 64K) in a local
    /// directory store, each opened, stat'ed and read whole, --parallel (default 8) at a time:
    /// with object_store straight from the directory (the reference), through the client
    /// library cold and warm, a pagefs mount and pages3 (warm), over --nodes pagestored
    /// (default 3, --page-size default 64K): files/s, MB/s, latency per file, CPU, and ratios
    /// to the reference; then a pagectl load of the same files into a cold cluster (time to
    /// the first page, to completion) against min(UFS read, disk write).
    Smallfiles(Smallfiles),
}

/// A command that takes only the common options.
#[derive(Args, Debug)]
pub struct Plain {
    #[command(flatten)]
    pub common: Common,
}

/// The options every command takes.
#[derive(Args, Debug)]
pub struct Common {
    #[command(flatten)]
    pub engine: EngineOpts,
    #[command(flatten)]
    pub target: TargetOpts,
    #[command(flatten)]
    pub dataset: DatasetOpts,
    // client: the cluster to read; ufs, fuse, s3: where to read hit counters. Without
    // --cluster, the targets start their own.
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

#[derive(Args, Debug)]
#[command(next_help_heading = "Common options")]
pub struct EngineOpts {
    /// Working directory on a real disk (default pagebench-data)
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Page size (default 4M)
    #[arg(long, value_name = "SIZE", value_parser = size_u32)]
    pub page_size: Option<u32>,
    /// Shards (per node for cluster targets; default: CPUs)
    #[arg(long, value_name = "N")]
    pub shards: Option<usize>,
    /// Engine targets: requests in flight per shard (default 8; compare: a list of depths,
    /// default 1,8,32); target modes: per reader (default 1)
    #[arg(long, value_name = "N", value_parser = list::<usize>)]
    pub qd: Option<List<usize>>,
    /// Time per workload (default 10)
    #[arg(long, value_name = "S", allow_negative_numbers = true, value_parser = positive)]
    pub seconds: Option<f64>,
    /// Dataset size (target modes: of the flat files; default 4G)
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub size: Option<u64>,
    /// Engine targets: write, write-full, read, read4k (compare also: preload); target modes:
    /// seq, pages, rand4k, rand128k, zipf, episodes (default all; local: write, read, read4k)
    #[arg(long, value_name = "A,B")]
    pub workloads: Option<String>,
    /// Seed of the data and the operation streams (default 42)
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// One JSON document instead of tables
    #[arg(long)]
    pub json: bool,
    /// Latency added to every under-storage request
    #[arg(long, value_name = "MS", allow_negative_numbers = true, value_parser = positive)]
    pub ufs_latency_ms: Option<f64>,
    /// Bandwidth of each under-storage request, MB/s
    #[arg(long, value_name = "MBPS", allow_negative_numbers = true, value_parser = positive)]
    pub ufs_mbps: Option<f64>,
    /// Scale: the client library against one node, per shard count, instead of the engine
    #[arg(long)]
    pub client: bool,
    /// Engine targets and raw: leave the shard threads unpinned (pagestored --no-pin)
    #[arg(long)]
    pub no_pin: bool,
}

#[derive(Args, Debug)]
#[command(next_help_heading = "Target mode options")]
pub struct TargetOpts {
    /// Readers; each value is a separate run (default 4; fusecmp 1,8)
    #[arg(long, value_name = "N[,N..]", value_parser = list::<usize>)]
    pub readers: Option<List<usize>>,
    /// Seq: bytes per read (default 1M)
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub block: Option<u64>,
    /// Stop each run after this many bytes (as well as --seconds)
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub bytes: Option<u64>,
    /// Zipf skew of the page (episodes: episode) choice; the zipf workload's default is 0.99
    #[arg(long, value_name = "S", allow_negative_numbers = true, value_parser = skew)]
    pub zipf: Option<f64>,
    /// Check every Nth operation of each reader against the generator (default 64; 0 never)
    #[arg(long, value_name = "N")]
    pub verify: Option<u64>,
    /// Nodes of the self-contained cluster (default 3; fusecmp 1)
    #[arg(long, value_name = "N")]
    pub nodes: Option<usize>,
    /// Add these processes' CPU time to the front end's column
    #[arg(long, value_name = "P[,P..]", value_parser = list::<u32>)]
    pub cpu_pids: Option<List<u32>>,
}

#[derive(Args, Debug)]
#[command(next_help_heading = "Dataset options (gen, and the self-contained targets)")]
pub struct DatasetOpts {
    /// Bytes per flat file (default 64M; --size / --file-size files)
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub file_size: Option<u64>,
    /// Episode files (default 16)
    #[arg(long, value_name = "N")]
    pub episodes: Option<u64>,
    /// Seconds per episode (default 20)
    #[arg(long, value_name = "N")]
    pub episode_secs: Option<u32>,
    /// Cameras per episode (default 3)
    #[arg(long, value_name = "N")]
    pub cameras: Option<u32>,
    /// Mean encoded frame size (default 16K; 30 fps, one GOP per second)
    #[arg(long, value_name = "SIZE", value_parser = size_u32)]
    pub frame_size: Option<u32>,
    /// grouped (topic-group chunking: cameras, then proprioception) or interleaved (per second)
    /// (default grouped)
    #[arg(long, value_name = "L", value_parser = dataset::Layout::parse)]
    pub layout: Option<dataset::Layout>,
    /// Episodes: frames per sample (default 4)
    #[arg(long, value_name = "N")]
    pub sample_frames: Option<u32>,
    /// Episodes: seconds of proprioception per sample (default 10)
    #[arg(long, value_name = "S", allow_negative_numbers = true, value_parser = non_negative)]
    pub window_secs: Option<f64>,
}

/// The generated preload manifest (compare, gen).
#[derive(Args, Debug)]
#[command(next_help_heading = "Preload manifest")]
pub struct Manifest {
    /// Compare preload: files in the manifest (default 10000)
    #[arg(long, value_name = "N")]
    pub manifest_files: Option<u64>,
    /// Compare preload: bytes per file (default 64K; each file takes at least one --page-size
    /// slot of cache, so pair small files with small pages)
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub manifest_file_size: Option<u64>,
}

#[derive(Args, Debug)]
pub struct Compare {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub manifest: Manifest,
}

#[derive(Args, Debug)]
pub struct Restart {
    #[command(flatten)]
    pub common: Common,
    /// Pages to fill (default 250000)
    #[arg(long, value_name = "N")]
    pub pages: Option<u64>,
}

#[derive(Args, Debug)]
pub struct Net {
    #[command(flatten)]
    pub common: Common,
    /// Also nginx over HTTPS
    #[arg(long)]
    pub nginx: bool,
}

#[derive(Args, Debug)]
pub struct Gen {
    #[command(flatten)]
    pub common: Common,
    /// Where to write: file:///dir, s3://bucket/prefix?endpoint=..., gs://...
    #[arg(long, value_name = "URL")]
    pub ufs: Option<String>,
    #[command(flatten)]
    pub manifest: Manifest,
}

#[derive(Args, Debug)]
pub struct Ufs {
    #[command(flatten)]
    pub common: Common,
    /// The under storage: file:///dir, s3://bucket/prefix?endpoint=..., gs://...
    #[arg(long, value_name = "URL")]
    pub ufs: Option<String>,
}

#[derive(Args, Debug)]
pub struct Fuse {
    #[command(flatten)]
    pub common: Common,
    /// The dataset root
    #[arg(long, value_name = "DIR")]
    pub path: Option<PathBuf>,
    /// O_DIRECT reads (bypass the kernel's page cache)
    #[arg(long)]
    pub direct: bool,
    /// Do not drop the files' cached pages before each run
    #[arg(long)]
    pub keep_page_cache: bool,
    /// Do not warm the self-contained cluster's cache first
    #[arg(long)]
    pub cold: bool,
}

#[derive(Args, Debug)]
pub struct S3 {
    #[command(flatten)]
    pub common: Common,
    /// The endpoint (e.g. http://127.0.0.1:7480)
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
    /// The bucket
    #[arg(long, value_name = "B")]
    pub bucket: Option<String>,
    /// Key prefix of the dataset root
    #[arg(long, value_name = "P")]
    pub prefix: Option<String>,
    /// Access key (default $AWS_ACCESS_KEY_ID)
    #[arg(long, value_name = "K")]
    pub access_key: Option<String>,
    /// Secret key (default $AWS_SECRET_ACCESS_KEY)
    #[arg(long, value_name = "S")]
    pub secret_key: Option<String>,
    /// Region (default us-east-1)
    #[arg(long, value_name = "R")]
    pub region: Option<String>,
    /// Do not warm the self-contained cluster's cache first
    #[arg(long)]
    pub cold: bool,
}

#[derive(Args, Debug)]
pub struct Client {
    #[command(flatten)]
    pub common: Common,
    /// The dataset's logical path (default /bench)
    #[arg(long, value_name = "P")]
    pub prefix: Option<String>,
    /// Do not warm the self-contained cluster's cache first
    #[arg(long)]
    pub cold: bool,
}

#[derive(Args, Debug)]
pub struct Fusecmp {
    #[command(flatten)]
    pub common: Common,
    /// O_DIRECT reads through the mount (bypass the kernel's page cache)
    #[arg(long)]
    pub direct: bool,
    /// Skip the engine runs
    #[arg(long)]
    pub no_engine: bool,
}

#[derive(Args, Debug)]
pub struct Pycmp {
    #[command(flatten)]
    pub common: Common,
    /// The Python interpreter, with the pagestore package and s3fs (default $PAGEBENCH_PYTHON,
    /// else target/pyenv/bin/python)
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// Rounds over the same cluster, each the Rust reference then every Python target; the
    /// table gives each target's median round and lists every round (default 1)
    #[arg(long, value_name = "N")]
    pub rounds: Option<usize>,
}

#[derive(Args, Debug)]
pub struct Checkpoint {
    #[command(flatten)]
    pub common: Common,
    /// Writers, one file of --size / N each (default 4)
    #[arg(long, value_name = "N")]
    pub writers: Option<usize>,
    /// The cluster's write replicas; each value is a separate cluster (default 1,2; at most
    /// --nodes)
    #[arg(long, value_name = "R[,R..]", value_parser = list::<u8>)]
    pub write_replicas: Option<List<u8>>,
}

#[derive(Args, Debug)]
pub struct Smallfiles {
    #[command(flatten)]
    pub common: Common,
    /// Files (default 10000; --file-size bytes each, default 64K)
    #[arg(long, value_name = "N")]
    pub files: Option<u64>,
    /// Files opened, stat'ed and read at once on every path (default 8)
    #[arg(long, value_name = "N")]
    pub parallel: Option<usize>,
}

/// A comma-separated list of values (`--readers 1,8`).
#[derive(Clone, Debug, PartialEq)]
pub struct List<T>(pub Vec<T>);

fn list<T: std::str::FromStr>(v: &str) -> Result<List<T>>
where
    T::Err: std::fmt::Display,
{
    v.split(',')
        .map(|x| x.trim().parse().map_err(|e| anyhow!("{x:?}: {e}")))
        .collect::<Result<_, _>>()
        .map(List)
}

fn number(v: &str) -> Result<f64> {
    Ok(v.trim().parse()?)
}

fn positive(v: &str) -> Result<f64> {
    match number(v)? {
        x if x.is_finite() && x > 0.0 => Ok(x),
        _ => bail!("must be a positive number"),
    }
}

fn non_negative(v: &str) -> Result<f64> {
    match number(v)? {
        x if x.is_finite() && x >= 0.0 => Ok(x),
        _ => bail!("must be a number >= 0"),
    }
}

fn skew(v: &str) -> Result<f64> {
    non_negative(v).map_err(|_| anyhow!("the skew must be a number >= 0"))
}

fn size_u32(v: &str) -> Result<u32> {
    u32::try_from(parse_size(v).map_err(anyhow::Error::msg)?).map_err(|_| anyhow!("too large"))
}

impl Common {
    /// Applies these options over `o`'s defaults.
    fn apply(self, o: &mut Opts) {
        let Common {
            engine: e,
            target: t,
            dataset: d,
            cluster,
        } = self;
        if let Some(dir) = e.dir {
            o.dir = dir;
            o.dir_given = true;
        }
        set(&mut o.page_size, e.page_size);
        set(&mut o.shards, e.shards);
        if let Some(List(qd)) = e.qd {
            o.qd = qd.first().copied().unwrap_or(0);
            o.qd_list = qd;
            o.qd_given = true;
        }
        set(&mut o.seconds, e.seconds);
        o.size_given = e.size.is_some();
        set(&mut o.size, e.size);
        if let Some(w) = e.workloads {
            o.workloads = w.split(',').map(str::to_string).collect();
            o.workloads_given = true;
        }
        set(&mut o.seed, e.seed);
        o.json = e.json;
        o.ufs_latency_ms = e.ufs_latency_ms;
        o.ufs_mbps = e.ufs_mbps;
        o.scale_client = e.client;
        o.pin = !e.no_pin;
        if let Some(List(r)) = t.readers {
            o.readers = r;
            o.readers_given = true;
        }
        set(&mut o.block, t.block);
        o.bytes = t.bytes;
        o.zipf = t.zipf;
        set(&mut o.verify_every, t.verify);
        o.nodes = t.nodes;
        if let Some(List(p)) = t.cpu_pids {
            o.cpu_pids = p;
        }
        set(&mut o.file_size, d.file_size);
        set(&mut o.episodes, d.episodes);
        set(&mut o.episode_secs, d.episode_secs);
        set(&mut o.cameras, d.cameras);
        set(&mut o.frame_size, d.frame_size);
        set(&mut o.layout, d.layout);
        set(&mut o.sample_frames, d.sample_frames);
        set(&mut o.window_secs, d.window_secs);
        o.cluster = cluster;
    }
}

impl Manifest {
    fn apply(self, o: &mut Opts) {
        set(&mut o.manifest_files, self.manifest_files);
        set(&mut o.manifest_file_size, self.manifest_file_size);
    }
}

fn set<T>(field: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *field = v;
    }
}

impl Command {
    /// The command's name and its options.
    pub fn into_opts(self) -> (&'static str, Opts) {
        let mut o = Opts::default();
        let name = match self {
            Command::Local(a) => ("local", a.common),
            Command::Raw(a) => ("raw", a.common),
            Command::Scale(a) => ("scale", a.common),
            Command::Cluster(a) => ("cluster", a.common),
            Command::Fanout(a) => ("fanout", a.common),
            Command::Compare(a) => {
                a.manifest.apply(&mut o);
                o.workloads = ["write", "write-full", "read", "read4k"]
                    .map(String::from)
                    .to_vec();
                ("compare", a.common)
            }
            Command::Restart(a) => {
                set(&mut o.pages, a.pages);
                ("restart", a.common)
            }
            Command::RestartOpen(a) => {
                set(&mut o.pages, a.pages);
                ("restart-open", a.common)
            }
            Command::Net(a) => {
                o.nginx = a.nginx;
                ("net", a.common)
            }
            Command::Gen(a) => {
                o.ufs = a.ufs;
                a.manifest.apply(&mut o);
                ("gen", a.common)
            }
            Command::Ufs(a) => {
                o.ufs = a.ufs;
                ("ufs", a.common)
            }
            Command::Fuse(a) => {
                o.path = a.path;
                o.direct = a.direct;
                o.keep_page_cache = a.keep_page_cache;
                o.cold = a.cold;
                ("fuse", a.common)
            }
            Command::S3(a) => {
                o.endpoint = a.endpoint;
                o.bucket = a.bucket;
                set(&mut o.prefix, a.prefix);
                o.access_key = a.access_key;
                o.secret_key = a.secret_key;
                set(&mut o.region, a.region);
                o.cold = a.cold;
                ("s3", a.common)
            }
            Command::Client(a) => {
                set(&mut o.prefix, a.prefix);
                o.cold = a.cold;
                ("client", a.common)
            }
            Command::Fusecmp(a) => {
                o.direct = a.direct;
                o.no_engine = a.no_engine;
                ("fusecmp", a.common)
            }
            Command::Pycmp(a) => {
                o.python = a.python;
                set(&mut o.rounds, a.rounds);
                o.block = 4 << 20;
                o.readers = vec![8];
                ("pycmp", a.common)
            }
            Command::Checkpoint(a) => {
                set(&mut o.writers, a.writers);
                if let Some(List(r)) = a.write_replicas {
                    o.write_replicas = Some(r);
                }
                ("checkpoint", a.common)
            }
            Command::Smallfiles(a) => {
                // Small files, one page each.
                o.file_size = 64 << 10;
                o.page_size = 64 << 10;
                set(&mut o.small_files, a.files);
                set(&mut o.parallel, a.parallel);
                ("smallfiles", a.common)
            }
        };
        let (name, common) = name;
        common.apply(&mut o);
        (name, o)
    }
}

/// Why a command line was not taken.
#[derive(Debug)]
pub enum Refused {
    /// clap's answer: a bad option or value, or the help asked for.
    Clap(clap::Error),
    /// An option given to a command that does not take it, or values that do not go together.
    Invalid(String),
}

/// Parses a command line (program name first) into the command's name and its options.
pub fn parse<I, T>(args: I) -> Result<(&'static str, Opts), Refused>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let mut cmd = pagestore_cli::wrap_help(Cli::command());
    let cli = cmd
        .try_get_matches_from_mut(&args)
        .and_then(|m| Cli::from_arg_matches(&m).map_err(|e| e.format(&mut cmd)))
        .map_err(|e| not_for_this_command(e, &args))?;
    let (name, o) = cli.command.into_opts();
    validate(name, &o).map_err(|e| Refused::Invalid(format!("{e:#}")))?;
    Ok((name, o))
}

/// An unknown option that another command takes is said as such: `--path does not apply to ufs
/// (only to fuse)`.
fn not_for_this_command(e: clap::Error, args: &[OsString]) -> Refused {
    let flag = match (e.kind(), e.get(ContextKind::InvalidArg)) {
        (clap::error::ErrorKind::UnknownArgument, Some(ContextValue::String(f))) => f.clone(),
        _ => return Refused::Clap(e),
    };
    let flag = flag.split_once('=').map_or(flag.as_str(), |(f, _)| f);
    let (Some(long), Some(cmd)) = (
        flag.strip_prefix("--"),
        args.get(1).and_then(|c| c.to_str()),
    ) else {
        return Refused::Clap(e);
    };
    let all = Cli::command();
    let takers: Vec<&str> = all
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .filter(|s| s.get_arguments().any(|a| a.get_long() == Some(long)))
        .map(|s| s.get_name())
        .collect();
    if takers.is_empty() || all.find_subcommand(cmd).is_none() {
        return Refused::Clap(e);
    }
    Refused::Invalid(format!(
        "{flag} does not apply to {cmd} (only to {})",
        takers.join(", ")
    ))
}

/// The checks across options.
fn validate(cmd: &str, o: &Opts) -> Result<()> {
    if o.shards == 0 || o.qd == 0 || o.qd_list.contains(&0) {
        bail!("--shards and --qd must be at least 1");
    }
    if o.qd_list.len() > 1 && cmd != "compare" {
        bail!("--qd takes one value here (a list of depths only with compare)");
    }
    if o.readers.is_empty() || o.readers.contains(&0) {
        bail!("--readers: every value must be at least 1");
    }
    if o.block == 0 || o.file_size == 0 {
        bail!("--block and --file-size must be at least 1 byte");
    }
    if o.direct && o.block % 4096 != 0 {
        bail!("--direct needs a --block that is a multiple of 4096");
    }
    if o.nodes == Some(0) {
        bail!("--nodes must be at least 1");
    }
    if o.manifest_files == 0 || o.manifest_file_size == 0 {
        bail!("--manifest-files and --manifest-file-size must be at least 1");
    }
    if o.writers == 0 {
        bail!("--writers must be at least 1");
    }
    if let Some(r) = &o.write_replicas {
        if r.is_empty() || r.contains(&0) {
            bail!("--write-replicas: every value must be at least 1");
        }
    }
    if cmd == "smallfiles" {
        if o.workloads_given {
            bail!("smallfiles runs one workload (--workloads does not apply)");
        }
        if o.small_files == 0 || o.parallel == 0 {
            bail!("--files and --parallel must be at least 1");
        }
        return Ok(());
    }
    if cmd == "checkpoint" {
        if o.workloads_given {
            bail!("checkpoint runs one workload (--workloads does not apply)");
        }
        o.replicas_for(o.nodes.unwrap_or(3))?;
        return Ok(());
    }
    let target = matches!(
        cmd,
        "gen" | "ufs" | "fuse" | "s3" | "client" | "fusecmp" | "pycmp"
    );
    if target || (cmd == "scale" && o.scale_client) {
        if o.workloads_given && cmd != "gen" {
            o.new_workloads()?;
        }
    } else {
        let allowed: &[&str] = if cmd == "compare" {
            &["write", "write-full", "read", "read4k", "preload"]
        } else {
            &["write", "write-full", "read", "read4k"]
        };
        for w in &o.workloads {
            if !allowed.contains(&w.as_str()) {
                bail!("unknown workload {w} for {cmd} ({})", allowed.join(", "));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn run(line: &str) -> Result<(&'static str, Opts), Refused> {
        parse(std::iter::once("pagebench").chain(line.split_whitespace()))
    }

    fn refusal(line: &str) -> String {
        match run(line) {
            Ok(_) => panic!("{line}: taken"),
            Err(Refused::Clap(e)) => e.to_string(),
            Err(Refused::Invalid(m)) => m,
        }
    }

    /// Every command, and the options only some commands take (with the commands that take
    /// them), as the hand-written parser had them.
    const COMMANDS: [&str; 18] = [
        "local",
        "compare",
        "restart",
        "restart-open",
        "raw",
        "net",
        "scale",
        "cluster",
        "fanout",
        "gen",
        "ufs",
        "fuse",
        "s3",
        "client",
        "fusecmp",
        "pycmp",
        "checkpoint",
        "smallfiles",
    ];
    const SCOPED: &[(&str, &[&str])] = &[
        ("--path", &["fuse"]),
        ("--direct", &["fuse", "fusecmp"]),
        ("--keep-page-cache", &["fuse"]),
        ("--no-engine", &["fusecmp"]),
        ("--python", &["pycmp"]),
        ("--rounds", &["pycmp"]),
        ("--ufs", &["ufs", "gen"]),
        ("--endpoint", &["s3"]),
        ("--bucket", &["s3"]),
        ("--prefix", &["s3", "client"]),
        ("--access-key", &["s3"]),
        ("--secret-key", &["s3"]),
        ("--region", &["s3"]),
        ("--manifest-files", &["compare", "gen"]),
        ("--manifest-file-size", &["compare", "gen"]),
        ("--nginx", &["net"]),
        ("--pages", &["restart", "restart-open"]),
        ("--cold", &["fuse", "s3", "client"]),
        ("--writers", &["checkpoint"]),
        ("--write-replicas", &["checkpoint"]),
        ("--files", &["smallfiles"]),
        ("--parallel", &["smallfiles"]),
    ];
    /// The options every command takes (with a value that parses, or none for a switch).
    const COMMON: &[(&str, Option<&str>)] = &[
        ("--dir", Some("/d")),
        ("--page-size", Some("1M")),
        ("--shards", Some("2")),
        ("--qd", Some("2")),
        ("--seconds", Some("2")),
        ("--size", Some("2M")),
        ("--seed", Some("2")),
        ("--json", None),
        ("--ufs-latency-ms", Some("2")),
        ("--ufs-mbps", Some("2")),
        ("--readers", Some("1,2")),
        ("--block", Some("8K")),
        ("--bytes", Some("2M")),
        ("--zipf", Some("1.1")),
        ("--verify", Some("2")),
        ("--nodes", Some("2")),
        ("--cpu-pids", Some("1,2")),
        ("--client", None),
        ("--cluster", Some("127.0.0.1:7400")),
        ("--tls-dir", Some("/t")),
        ("--file-size", Some("2M")),
        ("--episodes", Some("2")),
        ("--episode-secs", Some("2")),
        ("--cameras", Some("2")),
        ("--frame-size", Some("16K")),
        ("--layout", Some("interleaved")),
        ("--sample-frames", Some("2")),
        ("--window-secs", Some("2")),
    ];

    #[test]
    fn flags_parse_and_bad_ones_are_named() {
        let (cmd, o) = run("fuse --readers 1,8 --zipf 1.2 --block=256K --bytes 1G").unwrap();
        assert_eq!(cmd, "fuse");
        assert_eq!(o.readers, [1, 8]);
        assert!(o.readers_given);
        assert_eq!(o.zipf, Some(1.2));
        assert_eq!(o.block, 256 << 10);
        assert_eq!(o.bytes, Some(1 << 30));
        assert_eq!(o.reader_qd(), 1);
        for (bad, needles) in [
            ("fuse --readers 0", &["--readers"][..]),
            (
                "fuse --zipf -1",
                &["--zipf", "the skew must be a number >= 0"],
            ),
            ("fuse --workloads seq,nope", &["nope"]),
            (
                "ufs --path /x",
                &["--path does not apply to ufs (only to fuse)"],
            ),
            (
                "ufs --path=/x",
                &["--path does not apply to ufs (only to fuse)"],
            ),
            (
                "local --prefix p",
                &["--prefix does not apply to local (only to s3, client)"],
            ),
            ("s3 --layout diagonal", &["--layout"]),
            ("local --workloads seq", &["unknown workload seq"]),
            ("frobnicate", &["frobnicate"]),
            ("fuse --seconds", &["--seconds"]),
            (
                "fuse --seconds 0",
                &["--seconds", "must be a positive number"],
            ),
            ("local --qd zero", &["--qd"]),
            ("local --frobnicate", &["--frobnicate"]),
            (
                "local --shards 0",
                &["--shards and --qd must be at least 1"],
            ),
            ("fuse --direct --block 1000", &["--direct needs a --block"]),
        ] {
            let e = refusal(bad);
            for n in needles {
                assert!(e.contains(n), "{bad}: {e}");
            }
        }
        let (_, o) = run("fuse --seconds 1 --seconds 2 --json --json").unwrap();
        assert_eq!(o.seconds, 2.0);
        let (_, o) = run("compare --workloads read,preload").unwrap();
        assert_eq!(o.workloads, ["read", "preload"]);
        assert!(o.workloads_given);
        // compare: a depth sweep, the evicting inserts by default; one depth still works.
        let (_, o) = run("compare --qd 1,8,32").unwrap();
        assert_eq!((o.qd, o.qd_list.as_slice()), (1, &[1, 8, 32][..]));
        assert_eq!(crate::fio::depths(&o), [1, 8, 32]);
        assert_eq!(o.workloads, ["write", "write-full", "read", "read4k"]);
        let (_, o) = run("compare --dir D --size 4G --qd 8 --seconds 10").unwrap();
        assert_eq!(crate::fio::depths(&o), [8]);
        let (_, o) = run("compare").unwrap();
        assert_eq!(crate::fio::depths(&o), [1, 8, 32]);
        assert_eq!(o.qd, 8);
        assert!(refusal("local --qd 1,8").contains("a list of depths only with compare"));
        assert!(refusal("compare --qd 8,0").contains("--qd must be at least 1"));
        let (_, o) = run("local --workloads write,write-full").unwrap();
        assert_eq!(o.workloads, ["write", "write-full"]);
        // smallfiles: 10,000 files of 64 KiB in 64 KiB pages, 8 at a time, unless told.
        let (cmd, o) = run("smallfiles").unwrap();
        assert_eq!(cmd, "smallfiles");
        assert_eq!(
            (o.small_files, o.file_size, o.page_size),
            (10_000, 64 << 10, 64 << 10)
        );
        assert_eq!(o.parallel, 8);
        let (_, o) =
            run("smallfiles --files 7 --file-size 4K --parallel 3 --page-size 8K").unwrap();
        assert_eq!((o.small_files, o.file_size, o.page_size), (7, 4096, 8192));
        assert_eq!(o.parallel, 3);
        assert!(refusal("smallfiles --parallel 0").contains("--parallel"));
        assert!(refusal("smallfiles --workloads seq").contains("one workload"));
        // Defaults stay what they were.
        let (cmd, o) = run("local").unwrap();
        assert_eq!(cmd, "local");
        let d = Opts::default();
        assert_eq!((o.dir, o.dir_given), (d.dir, false));
        assert_eq!((o.page_size, o.qd, o.qd_given), (d.page_size, 8, false));
        assert_eq!((o.seconds, o.size, o.seed), (10.0, 4 << 30, 42));
        assert_eq!(o.cluster, ClusterArgs::default());
    }

    #[test]
    fn each_command_takes_the_options_it_took() {
        for cmd in COMMANDS {
            for (flag, value) in COMMON {
                let line = format!("{cmd} {flag} {}", value.unwrap_or(""));
                if let Err(e) = run(&line) {
                    panic!("{line}: {e:?}");
                }
            }
            for (flag, takers) in SCOPED {
                let switch = matches!(
                    *flag,
                    "--nginx" | "--cold" | "--direct" | "--keep-page-cache" | "--no-engine"
                );
                let line = format!("{cmd} {flag} {}", if switch { "" } else { "2" });
                match run(&line) {
                    Ok(_) => assert!(takers.contains(&cmd), "{line} taken"),
                    Err(Refused::Invalid(m)) if m.contains("does not apply") => {
                        assert!(!takers.contains(&cmd), "{line}: {m}");
                        assert!(m.starts_with(&format!("{flag} does not apply to {cmd}")));
                    }
                    Err(e) => panic!("{line}: {e:?}"),
                }
            }
        }
        let (_, o) = run("restart-open --pages 7 --dir /x").unwrap();
        assert_eq!((o.pages, o.dir), (7, PathBuf::from("/x")));
        let (_, o) = run("scale --client --shards 4").unwrap();
        assert!(o.scale_client);
    }

    #[test]
    fn options_reach_the_options_struct() {
        let (cmd, o) = run(
            "s3 --endpoint http://e --bucket b --prefix p --access-key k --secret-key s \
             --region r --cold --cluster 10.0.0.1:7400 --tls-dir /t --timeout 2 --no-fallback",
        )
        .unwrap();
        assert_eq!(cmd, "s3");
        assert_eq!(o.endpoint.as_deref(), Some("http://e"));
        assert_eq!(o.bucket.as_deref(), Some("b"));
        assert_eq!(o.prefix, "p");
        assert_eq!(o.access_key.as_deref(), Some("k"));
        assert_eq!(o.secret_key.as_deref(), Some("s"));
        assert_eq!(o.region, "r");
        assert!(o.cold);
        assert_eq!(o.cluster.cluster.as_deref(), Some("10.0.0.1:7400"));
        assert_eq!(o.cluster.tls_dir(), PathBuf::from("/t"));
        let c = o.cluster.client_options().unwrap();
        assert!(!c.fallback);
        assert_eq!(c.call_timeout, std::time::Duration::from_secs(2));
        let (_, o) = run(
            "gen --ufs file:///u --manifest-files 5 --manifest-file-size 4K --file-size 1M \
             --episodes 3 --episode-secs 4 --cameras 2 --frame-size 8K --layout interleaved \
             --sample-frames 6 --window-secs 0",
        )
        .unwrap();
        assert_eq!(o.ufs.as_deref(), Some("file:///u"));
        assert_eq!((o.manifest_files, o.manifest_file_size), (5, 4 << 10));
        assert_eq!((o.file_size, o.episodes, o.episode_secs), (1 << 20, 3, 4));
        assert_eq!((o.cameras, o.frame_size), (2, 8 << 10));
        assert_eq!(o.layout, dataset::Layout::parse("interleaved").unwrap());
        assert_eq!((o.sample_frames, o.window_secs), (6, 0.0));
        // The etcd flags follow the shared rule.
        let (_, o) = run("client --cluster 127.0.0.1:1 --etcd-user u").unwrap();
        assert!(o.cluster.client_options().is_err());
    }

    #[test]
    fn help_is_clap_s() {
        for line in ["--help", "fuse --help", "help", "help s3"] {
            match run(line) {
                Err(Refused::Clap(e)) => assert!(!e.use_stderr(), "{line}"),
                other => panic!("{line}: {other:?}"),
            }
        }
        let help = Cli::command()
            .find_subcommand_mut("fuse")
            .unwrap()
            .render_long_help()
            .to_string();
        for flag in [
            "--path",
            "--direct",
            "--readers",
            "--cluster",
            "--tls-dir",
            "--layout",
        ] {
            assert!(help.contains(flag), "{help}");
        }
        assert!(!help.contains("--endpoint"), "{help}");
    }
}
