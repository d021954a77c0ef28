//! `pagebench`: pagestore's benchmark harness.
//!
//! Every speed figure is printed next to a reference measured in the same run (these machines
//! drift from run to run), as a ratio. See docs/BENCHMARKS.md and `USAGE` below.

use pagestore_tools::parse_size;

mod bench;
mod cluster;
mod dataset;
mod fio;
mod frontends;
mod fusecmp;
mod local;
mod modes;
mod net;
mod preload;
mod zipf;

use std::path::PathBuf;

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
    /// Seconds per read workload.
    pub seconds: f64,
    /// Dataset size in bytes (the target modes: of the flat files).
    pub size: u64,
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
    /// An external cluster (member file or address).
    pub cluster: Option<String>,
    /// Its TLS directory.
    pub tls_dir: Option<PathBuf>,
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
            seconds: 10.0,
            size: 4 << 30,
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
            cluster: None,
            tls_dir: None,
            nodes: None,
            direct: false,
            keep_page_cache: false,
            cold: false,
            no_engine: false,
            scale_client: false,
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

    /// Operations in flight per reader in the target modes (default 1).
    pub fn reader_qd(&self) -> usize {
        if self.qd_given {
            self.qd
        } else {
            1
        }
    }

    /// The target modes' workloads.
    pub fn new_workloads(&self) -> Result<Vec<bench::Workload>, String> {
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

    /// `--tls-dir`, else `$PAGESTORE_TLS_DIR`, else `$PAGESTORE_HOME/cache/tls`.
    pub fn tls_dir(&self) -> PathBuf {
        self.tls_dir.clone().unwrap_or_else(|| {
            std::env::var_os("PAGESTORE_TLS_DIR").map_or_else(
                || pagestore_tools::home().join("cache").join("tls"),
                PathBuf::from,
            )
        })
    }
}

const USAGE: &str = "\
usage: pagebench COMMAND [OPTIONS]

engine and network (the reference is fio or nginx, measured in the same run):
  local      the engine alone: write (insert), read (whole pages), read4k
  compare    the same workloads through fio, then the engine, with ratios; --workloads preload:
             a pagectl load of a generated --manifest-files manifest (time to the first page
             and to completion) against the UFS read and disk write bandwidths
  restart    fill a cache, restart it, report restart time and memory per page
  net        4 MiB page hits over QUIC from a node's shard endpoints on loopback (--nginx: and
             the same bytes from nginx over HTTPS)
  scale      the local workloads with 1, 2, 4 ... --shards shards (--client: the client
             library against one node with that many shards, warm, per shard count)
  raw        random reads of the cache files with glommio alone (no engine)
  cluster    3 pagestored processes over a local-directory under storage: cold and warm reads
             through the client against object_store and the local engine; a node SIGKILLed
             during a scan

targets (the same workloads through each front door; without a target, each starts a local
cluster over DIR/dataset, warms it, and its front end):
  gen        write the dataset (flat files, episode files) to --dir DIR or --ufs URL
  ufs        object_store straight to the under storage (--ufs URL; default DIR/dataset): the
             no-cache baseline
  fuse       plain files under --path DIR (the dataset root, e.g. MOUNT/bench of a pagefs
             mount); without --path: pagefs mounted at DIR/fuse/mnt
  s3         an S3 endpoint with object_store's S3 client (--endpoint URL --bucket B); without
             --endpoint: pages3 in front of the local cluster
  client     the client library (--cluster FILE|ADDR); without --cluster: the local cluster
  fusecmp    issue 6: seq, rand4k and rand128k with 1 and 8 readers through a pagefs mount, the
             client library and the local engine over the same warm dataset; ratios FUSE/client
             and FUSE/engine; checksums compared

common options:
  --dir DIR              working directory on a real disk (default pagebench-data)
  --page-size SIZE       page size (default 4M)
  --shards N             shards (per node for cluster targets; default: CPUs)
  --qd N                 engine targets: requests in flight per shard (default 8); target modes:
                         per reader (default 1)
  --seconds S            time per workload (default 10)
  --size SIZE            dataset size (target modes: of the flat files; default 4G)
  --workloads A,B        engine targets: write, read, read4k (compare also: preload); target
                         modes: seq, pages, rand4k, rand128k, zipf, episodes (default all)
  --seed N               seed of the data and the operation streams (default 42)
  --json                 one JSON document instead of tables
  --ufs-latency-ms MS    latency added to every under-storage request
  --ufs-mbps MBPS        bandwidth of each under-storage request, MB/s
  --pages N              restart: pages to fill (default 250000)
  --nginx                net: also nginx over HTTPS

target mode options:
  --readers N[,N..]      readers; each value is a separate run (default 4; fusecmp 1,8)
  --block SIZE           seq: bytes per read (default 1M)
  --bytes SIZE           stop each run after this many bytes (as well as --seconds)
  --zipf S               Zipf skew of the page (episodes: episode) choice; the zipf workload's
                         default is 0.99
  --verify N             check every Nth operation of each reader against the generator
                         (default 64; 0 never)
  --nodes N              nodes of the self-contained cluster (default 3; fusecmp 1)
  --cold                 do not warm the self-contained cluster's cache first
  --cpu-pids P[,P..]     add these processes' CPU time to the front end's column
  --cluster FILE|ADDR    client: the cluster to read; ufs, fuse, s3: where to read hit counters
  --tls-dir DIR          the cluster's TLS directory (default $PAGESTORE_TLS_DIR or
                         $PAGESTORE_HOME/cache/tls)
  --path DIR             fuse: the dataset root
  --direct               fuse: O_DIRECT reads (bypass the kernel's page cache)
  --keep-page-cache      fuse: do not drop the files' cached pages before each run
  --no-engine            fusecmp: skip the engine runs
  --ufs URL              ufs, gen: file:///dir, s3://bucket/prefix?endpoint=..., gs://...
  --endpoint URL         s3: the endpoint (e.g. http://127.0.0.1:7480)
  --bucket B             s3: the bucket
  --prefix P             s3: key prefix of the dataset root; client: its logical path
                         (default /bench)
  --access-key K         s3: access key (default $AWS_ACCESS_KEY_ID)
  --secret-key S         s3: secret key (default $AWS_SECRET_ACCESS_KEY)
  --region R             s3: region (default us-east-1)

dataset options (gen, and the self-contained targets):
  --file-size SIZE       bytes per flat file (default 64M; --size / --file-size files)
  --episodes N           episode files (default 16)
  --episode-secs N       seconds per episode (default 20)
  --cameras N            cameras per episode (default 3)
  --frame-size SIZE      mean encoded frame size (default 16K; 30 fps, one GOP per second)
  --layout L             grouped (topic-group chunking: cameras, then proprioception) or
                         interleaved (per second) (default grouped)
  --sample-frames N      episodes: frames per sample (default 4)
  --window-secs S        episodes: seconds of proprioception per sample (default 10)
  --manifest-files N     compare preload: files in the manifest (default 10000)
  --manifest-file-size SIZE
                         compare preload: bytes per file (default 64K; each file takes at
                         least one --page-size slot of cache, so pair small files with small
                         pages)

sizes take K, M, G, T suffixes (powers of 1024)";

/// Options that only some commands take: (flag, commands).
const SCOPED: &[(&str, &[&str])] = &[
    ("--path", &["fuse"]),
    ("--direct", &["fuse", "fusecmp"]),
    ("--keep-page-cache", &["fuse"]),
    ("--no-engine", &["fusecmp"]),
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
];

const ENGINE_COMMANDS: &[&str] = &[
    "local",
    "compare",
    "restart",
    "restart-open",
    "raw",
    "net",
    "scale",
    "cluster",
];
const TARGET_COMMANDS: &[&str] = &["gen", "ufs", "fuse", "s3", "client", "fusecmp"];

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    v.parse().map_err(|e| format!("{flag} {v:?}: {e}"))
}

fn list<T: std::str::FromStr>(flag: &str, v: &str) -> Result<Vec<T>, String>
where
    T::Err: std::fmt::Display,
{
    v.split(',').map(|x| num(flag, x.trim())).collect()
}

fn positive(flag: &str, v: f64) -> Result<f64, String> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(format!("{flag} must be a positive number"))
    }
}

fn parse(args: &[String]) -> Result<(String, Opts), String> {
    let mut o = Opts::default();
    let cmd = args.first().ok_or(USAGE)?.clone();
    if matches!(cmd.as_str(), "-h" | "--help" | "help") {
        return Err(USAGE.into());
    }
    if !ENGINE_COMMANDS.contains(&cmd.as_str()) && !TARGET_COMMANDS.contains(&cmd.as_str()) {
        return Err(format!("unknown command {cmd:?}\n{USAGE}"));
    }
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        if let Some((_, cmds)) = SCOPED.iter().find(|(f, _)| *f == flag) {
            if !cmds.contains(&cmd.as_str()) {
                return Err(format!(
                    "{flag} does not apply to {cmd} (only to {})",
                    cmds.join(", ")
                ));
            }
        }
        let mut val = || {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or(format!("{flag} needs a value"))
        };
        match flag {
            "--dir" => {
                o.dir = PathBuf::from(val()?);
                o.dir_given = true;
            }
            "--page-size" => {
                o.page_size = u32::try_from(parse_size(&val()?)?)
                    .map_err(|_| "--page-size: too large".to_string())?
            }
            "--shards" => o.shards = num(flag, &val()?)?,
            "--qd" => {
                o.qd = num(flag, &val()?)?;
                o.qd_given = true;
            }
            "--seconds" => o.seconds = positive(flag, num(flag, &val()?)?)?,
            "--size" => o.size = parse_size(&val()?)?,
            "--pages" => o.pages = num(flag, &val()?)?,
            "--seed" => o.seed = num(flag, &val()?)?,
            "--workloads" => {
                o.workloads = val()?.split(',').map(str::to_string).collect();
                o.workloads_given = true;
            }
            "--json" => o.json = true,
            "--nginx" => o.nginx = true,
            "--ufs-latency-ms" => o.ufs_latency_ms = Some(positive(flag, num(flag, &val()?)?)?),
            "--ufs-mbps" => o.ufs_mbps = Some(positive(flag, num(flag, &val()?)?)?),
            "--readers" => {
                o.readers = list(flag, &val()?)?;
                o.readers_given = true;
            }
            "--block" => o.block = parse_size(&val()?)?,
            "--bytes" => o.bytes = Some(parse_size(&val()?)?),
            "--zipf" => {
                let s: f64 = num(flag, &val()?)?;
                if !s.is_finite() || s < 0.0 {
                    return Err("--zipf: the skew must be a number >= 0".into());
                }
                o.zipf = Some(s);
            }
            "--verify" => o.verify_every = num(flag, &val()?)?,
            "--nodes" => o.nodes = Some(num(flag, &val()?)?),
            "--cold" => o.cold = true,
            "--cpu-pids" => o.cpu_pids = list(flag, &val()?)?,
            "--cluster" => o.cluster = Some(val()?),
            "--tls-dir" => o.tls_dir = Some(PathBuf::from(val()?)),
            "--path" => o.path = Some(PathBuf::from(val()?)),
            "--direct" => o.direct = true,
            "--keep-page-cache" => o.keep_page_cache = true,
            "--no-engine" => o.no_engine = true,
            "--client" => o.scale_client = true,
            "--ufs" => o.ufs = Some(val()?),
            "--endpoint" => o.endpoint = Some(val()?),
            "--bucket" => o.bucket = Some(val()?),
            "--prefix" => o.prefix = val()?,
            "--access-key" => o.access_key = Some(val()?),
            "--secret-key" => o.secret_key = Some(val()?),
            "--region" => o.region = val()?,
            "--file-size" => o.file_size = parse_size(&val()?)?,
            "--episodes" => o.episodes = num(flag, &val()?)?,
            "--episode-secs" => o.episode_secs = num(flag, &val()?)?,
            "--cameras" => o.cameras = num(flag, &val()?)?,
            "--frame-size" => {
                o.frame_size = u32::try_from(parse_size(&val()?)?)
                    .map_err(|_| "--frame-size: too large".to_string())?
            }
            "--layout" => o.layout = dataset::Layout::parse(&val()?)?,
            "--sample-frames" => o.sample_frames = num(flag, &val()?)?,
            "--window-secs" => {
                let w: f64 = num(flag, &val()?)?;
                if !w.is_finite() || w < 0.0 {
                    return Err("--window-secs must be a number >= 0".into());
                }
                o.window_secs = w;
            }
            "--manifest-files" => o.manifest_files = num(flag, &val()?)?,
            "--manifest-file-size" => o.manifest_file_size = parse_size(&val()?)?,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
    }
    if o.shards == 0 || o.qd == 0 {
        return Err("--shards and --qd must be at least 1".into());
    }
    if o.readers.is_empty() || o.readers.contains(&0) {
        return Err("--readers: every value must be at least 1".into());
    }
    if o.block == 0 || o.file_size == 0 {
        return Err("--block and --file-size must be at least 1 byte".into());
    }
    if o.direct && o.block % 4096 != 0 {
        return Err("--direct needs a --block that is a multiple of 4096".into());
    }
    if o.nodes == Some(0) {
        return Err("--nodes must be at least 1".into());
    }
    if o.manifest_files == 0 || o.manifest_file_size == 0 {
        return Err("--manifest-files and --manifest-file-size must be at least 1".into());
    }
    if TARGET_COMMANDS.contains(&cmd.as_str()) || (cmd == "scale" && o.scale_client) {
        if o.workloads_given && cmd != "gen" {
            o.new_workloads()?;
        }
    } else {
        let allowed: &[&str] = if cmd == "compare" {
            &["write", "read", "read4k", "preload"]
        } else {
            &["write", "read", "read4k"]
        };
        for w in &o.workloads {
            if !allowed.contains(&w.as_str()) {
                return Err(format!(
                    "unknown workload {w} for {cmd} ({})",
                    allowed.join(", ")
                ));
            }
        }
    }
    Ok((cmd, o))
}

/// `compare`: the engine against fio, and with `preload` the preload job.
fn compare(o: &Opts) -> Result<(), String> {
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
    if !preload {
        return fio::compare(o);
    }
    let results = if engine.workloads.is_empty() {
        None
    } else {
        Some(fio::compare_results(&engine)?)
    };
    let p = preload::run_preload(o)?;
    if o.json {
        let mut v = serde_json::json!({"preload": p.to_json()});
        if let Some((r, f)) = &results {
            v["workloads"] = local::report_json(&engine, r, Some(f));
        }
        println!("{v}");
    } else {
        if let Some((r, f)) = &results {
            local::report(&engine, r, Some(f));
            println!();
        }
        p.print();
    }
    Ok(())
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
        "compare" => compare(&opts),
        "restart" => local::restart(&opts),
        "restart-open" => local::restart_open(&opts),
        "raw" => local::raw(&opts),
        "net" => net::run_net(&opts, opts.nginx),
        "scale" if opts.scale_client => modes::scale_client(&opts),
        "scale" => local::scale(&opts),
        "cluster" => cluster::run_cluster(&opts),
        "gen" => dataset::run_gen(&opts),
        "ufs" => modes::run_mode(&opts, modes::Mode::Ufs),
        "fuse" => modes::run_mode(&opts, modes::Mode::Fuse),
        "s3" => modes::run_mode(&opts, modes::Mode::S3),
        "client" => modes::run_mode(&opts, modes::Mode::Client),
        "fusecmp" => fusecmp::run_fusecmp(&opts),
        _ => Err(format!("unknown command {cmd}\n{USAGE}")),
    };
    if let Err(e) = r {
        eprintln!("pagebench: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn flags_parse_and_bad_ones_are_named() {
        let (cmd, o) = parse(&args(
            "fuse --readers 1,8 --zipf 1.2 --block=256K --bytes 1G",
        ))
        .unwrap();
        assert_eq!(cmd, "fuse");
        assert_eq!(o.readers, [1, 8]);
        assert_eq!(o.zipf, Some(1.2));
        assert_eq!(o.block, 256 << 10);
        assert_eq!(o.bytes, Some(1 << 30));
        assert_eq!(o.reader_qd(), 1);
        for (bad, needle) in [
            ("fuse --readers 0", "--readers"),
            ("fuse --zipf -1", "--zipf"),
            ("fuse --workloads seq,nope", "nope"),
            ("ufs --path /x", "--path does not apply to ufs"),
            ("s3 --layout diagonal", "--layout"),
            ("local --workloads seq", "unknown workload seq"),
            ("frobnicate", "unknown command"),
            ("fuse --seconds", "--seconds needs a value"),
            ("fuse --seconds 0", "--seconds must be a positive"),
        ] {
            let e = parse(&args(bad)).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
        let (_, o) = parse(&args("compare --workloads read,preload")).unwrap();
        assert_eq!(o.workloads, ["read", "preload"]);
    }

    #[test]
    fn every_flag_in_the_usage_is_parsed() {
        // Each `--flag` the help text names is accepted by some command.
        for flag in USAGE
            .split_whitespace()
            .filter(|w| w.starts_with("--") && w.len() > 2)
            .map(|w| w.trim_end_matches([',', ':', ')', ';']))
        {
            let cmd = SCOPED
                .iter()
                .find(|(f, _)| *f == flag)
                .map_or("fuse", |(_, c)| c[0]);
            let takes_value = !matches!(
                flag,
                "--json" | "--nginx" | "--cold" | "--direct" | "--keep-page-cache" | "--no-engine"
            );
            let value = match flag {
                "--layout" => "grouped",
                "--workloads" => "seq",
                "--readers" | "--cpu-pids" => "1",
                _ => "2",
            };
            let mut a = vec![cmd.to_string(), flag.to_string()];
            if takes_value {
                a.push(value.to_string());
            }
            if let Err(e) = parse(&a) {
                assert!(!e.contains("unknown option"), "{flag}: {e}");
            }
        }
    }
}
