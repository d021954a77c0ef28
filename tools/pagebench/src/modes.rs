//! The target modes `ufs`, `fuse`, `s3` and `client`: the same workloads (see `bench.rs`)
//! through one front door each, against a dataset written by `pagebench gen`.
//!
//! Each mode either reads an existing target (`ufs --ufs URL`, `fuse --path DIR`,
//! `s3 --endpoint URL --bucket B`, `client --cluster FILE`) or, without one, sets everything up
//! itself: the dataset under `DIR/dataset`, three `pagestored` processes over it (`--nodes`),
//! the cache warmed (unless `--cold`), and the front end (`pagefs` mounted at `DIR/fuse/mnt`,
//! or `pages3` on a free port).

use std::{path::PathBuf, sync::Arc};

use anyhow::{anyhow, bail, Context as _, Result};
use pagestore_client::ufs::MountTable;

use crate::{
    bench::{self, AsyncTarget, Catalog, FsTarget, Probe, RunResult, Spec, Target, Workload},
    dataset::{self, Dataset, Dest, DESCRIPTOR},
    frontends::{self, FuseMount, Gateway, Stack, PREFIX},
    Opts,
};

/// The front door.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// object_store straight to the under storage.
    Ufs,
    /// Plain files under a path (a pagefs mount).
    Fuse,
    /// S3 (pages3) with object_store's S3 client.
    S3,
    /// The client library.
    Client,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Ufs => "ufs",
            Mode::Fuse => "fuse",
            Mode::S3 => "s3",
            Mode::Client => "client",
        }
    }
}

/// The 1-, 5- and 15-minute load averages.
pub fn loadavg() -> [f64; 3] {
    let s = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut it = s.split_whitespace().map(|v| v.parse().unwrap_or(f64::NAN));
    [
        it.next().unwrap_or(f64::NAN),
        it.next().unwrap_or(f64::NAN),
        it.next().unwrap_or(f64::NAN),
    ]
}

/// A warning when other work shares the CPUs (numbers taken then are noise).
pub fn load_warning() -> Option<String> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let l = loadavg();
    (l[0] > 0.5 * cpus).then(|| {
        format!(
            "warning: load average {:.2} on {cpus} CPUs before the run: other work shares the \
             CPUs, so these figures are noise",
            l[0]
        )
    })
}

/// Generates (or keeps) the dataset `o` describes under `DIR/dataset`.
pub fn local_dataset(
    o: &Opts,
    ds: &Dataset,
    rt: &tokio::runtime::Runtime,
    notes: &mut Vec<String>,
) -> Result<PathBuf> {
    let dir = o.dir.join("dataset");
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let r = dataset::generate(ds, &Dest::Dir(dir.clone()), rt)?;
    notes.push(format!(
        "dataset {}: {:.2} GB ({} flat files of {} MiB, {} episodes); wrote {} files in {:.1} s, \
         kept {}",
        dir.display(),
        ds.total_bytes() as f64 / 1e9,
        ds.files,
        ds.file_size >> 20,
        ds.episodes.count,
        r.written,
        r.secs,
        r.kept
    ));
    Ok(dir)
}

/// Starts a cluster over the local dataset and warms it (unless `--cold`).
pub fn local_stack(
    o: &Opts,
    name: &str,
    ds: &Dataset,
    rt: &tokio::runtime::Runtime,
    notes: &mut Vec<String>,
) -> Result<(Stack, Arc<Catalog>)> {
    let data = local_dataset(o, ds, rt, notes)?;
    let cat = Arc::new(Catalog::new(ds.clone()));
    let work = o.dir.join(name);
    std::fs::create_dir_all(&work).with_context(|| work.display().to_string())?;
    let nodes = o.nodes.unwrap_or(3);
    let stack = Stack::start(o, &work, &data, nodes, cat.files.iter().map(|e| e.size), rt)?;
    notes.push(format!(
        "cluster: {nodes} pagestored x {} shard(s), {} KiB pages, dataset mounted at {PREFIX}{}",
        o.shards,
        o.page_size >> 10,
        match (o.ufs_latency_ms, o.ufs_mbps) {
            (None, None) => String::new(),
            (l, m) => format!(
                " (emulated store: {} ms, {} MB/s per request)",
                l.unwrap_or(0.0),
                m.map_or("unlimited".into(), |m| m.to_string())
            ),
        }
    ));
    if o.cold {
        notes.push("cold: the cache starts empty (--cold)".into());
    } else {
        let secs = stack.warm(&cat, rt)?;
        notes.push(format!(
            "warmed: every file loaded into the cache in {secs:.1} s ({:.0} MB/s)",
            cat.bytes() as f64 / 1e6 / secs.max(1e-3)
        ));
    }
    Ok((stack, cat))
}

async fn descriptor_store(table: &MountTable, prefix: &str) -> Result<Dataset> {
    let path = format!("{prefix}/{DESCRIPTOR}");
    let info = table
        .stat(&path)
        .await
        .map_err(|e| anyhow!("{path}: {e} (write the dataset with pagebench gen first)"))?;
    let b = table
        .read(&info, 0..info.size)
        .await
        .with_context(|| path.clone())?;
    Dataset::from_json(&b)
}

/// Everything a mode needs to run workloads, and what keeps it alive.
struct Setup {
    label: String,
    target: Target,
    cat: Arc<Catalog>,
    probe: Probe,
    page: u64,
    notes: Vec<String>,
    // Dropped in this order: the front end first, then the nodes.
    _mount: Option<FuseMount>,
    _gateway: Option<Gateway>,
    _stack: Option<Stack>,
}

impl Setup {
    /// A setup that keeps nothing alive beyond its target (add keepers with the `with_` methods).
    fn new(
        label: &str,
        target: Target,
        cat: Arc<Catalog>,
        probe: Probe,
        page: u64,
        notes: Vec<String>,
    ) -> Setup {
        Setup {
            label: label.into(),
            target,
            cat,
            probe,
            page,
            notes,
            _mount: None,
            _gateway: None,
            _stack: None,
        }
    }

    fn with_stack(mut self, stack: Stack) -> Setup {
        self._stack = Some(stack);
        self
    }

    fn with_mount(mut self, mount: FuseMount) -> Setup {
        self._mount = Some(mount);
        self
    }

    fn with_gateway(mut self, gateway: Gateway) -> Setup {
        self._gateway = Some(gateway);
        self
    }
}

/// What a local stack is measured by: its client's counters, its node processes and `frontend`.
fn stack_probe(stack: &Stack, frontend: Vec<u32>) -> Probe {
    Probe {
        counters: Some(stack.client.clone()),
        nodes: stack.pids(),
        frontend,
    }
}

fn store_target(
    table: Arc<MountTable>,
    prefix: &str,
    rt: &tokio::runtime::Runtime,
) -> Result<(Target, Arc<Catalog>)> {
    let ds = rt.block_on(descriptor_store(&table, prefix))?;
    let cat = Arc::new(Catalog::new(ds));
    let infos = rt.block_on(bench::stat_all(&cat, prefix, |p| {
        let t = table.clone();
        async move { Ok(t.stat(&p).await?) }
    }))?;
    Ok((
        Target::Async(Arc::new(AsyncTarget::Store { table, infos })),
        cat,
    ))
}

fn client_target(
    client: Arc<pagestore_client::Client>,
    prefix: &str,
    cat: Option<Arc<Catalog>>,
    rt: &tokio::runtime::Runtime,
) -> Result<(Target, Arc<Catalog>)> {
    let cat = match cat {
        Some(c) => c,
        None => {
            let path = format!("{prefix}/{DESCRIPTOR}");
            let b = rt
                .block_on(client.read(&path, 0..u64::MAX))
                .map_err(|e| anyhow!("{path}: {e} (write the dataset with pagebench gen first)"))?;
            Arc::new(Catalog::new(Dataset::from_json(&b)?))
        }
    };
    let infos = rt.block_on(bench::stat_all(&cat, prefix, |p| {
        let c = client.clone();
        async move { Ok(c.stat(&p).await?) }
    }))?;
    Ok((
        Target::Async(Arc::new(AsyncTarget::Client { client, infos })),
        cat,
    ))
}

fn external_counters(o: &Opts, rt: &tokio::runtime::Runtime) -> Result<Probe> {
    let mut probe = Probe {
        frontend: o.cpu_pids.clone(),
        ..Probe::default()
    };
    if o.cluster.cluster.is_some() {
        probe.counters = Some(rt.block_on(frontends::connect(&o.cluster))?);
    }
    Ok(probe)
}

/// `ufs`: the under storage read directly with object_store (no cache).
fn setup_ufs(
    o: &Opts,
    ds: &Dataset,
    rt: &tokio::runtime::Runtime,
    mut notes: Vec<String>,
) -> Result<Setup> {
    let url = match &o.ufs {
        Some(u) => u.clone(),
        None => {
            let dir = local_dataset(o, ds, rt, &mut notes)?;
            let dir = std::fs::canonicalize(&dir).with_context(|| dir.display().to_string())?;
            format!("file://{}", dir.display())
        }
    };
    let url = bench::with_emulation(&url, o);
    notes.push(format!(
        "under storage {} read with object_store (no cache)",
        pagestore_client::ufs::redact(&url)
    ));
    let table = Arc::new(MountTable::new(&[("/ufs".to_string(), url)]).context("--ufs")?);
    let (target, cat) = store_target(table, "/ufs", rt)?;
    Ok(Setup::new(
        "ufs",
        target,
        cat,
        external_counters(o, rt)?,
        u64::from(o.page_size),
        notes,
    ))
}

/// `fuse --path`: files under an existing mount.
fn setup_fuse_path(
    o: &Opts,
    root: &std::path::Path,
    rt: &tokio::runtime::Runtime,
    mut notes: Vec<String>,
) -> Result<Setup> {
    let b = std::fs::read(root.join(DESCRIPTOR)).map_err(|e| {
        anyhow!(
            "{}: {e} (--path must be the dataset root, written by pagebench gen)",
            root.join(DESCRIPTOR).display()
        )
    })?;
    let cat = Arc::new(Catalog::new(Dataset::from_json(&b)?));
    let fs = FsTarget {
        root: root.to_path_buf(),
        direct: o.direct,
        drop_cache: !o.keep_page_cache,
    };
    fs.check(&cat)?;
    notes.push(format!("files under {}", root.display()));
    Ok(Setup::new(
        "fuse",
        Target::Fs(Arc::new(fs)),
        cat,
        external_counters(o, rt)?,
        u64::from(o.page_size),
        notes,
    ))
}

/// `fuse`: a local cluster with a pagefs mount.
fn setup_fuse_local(
    o: &Opts,
    ds: &Dataset,
    rt: &tokio::runtime::Runtime,
    mut notes: Vec<String>,
) -> Result<Setup> {
    let (stack, cat) = local_stack(o, "fuse", ds, rt, &mut notes)?;
    let mount = FuseMount::start(&stack.cluster, &o.dir.join("fuse").join("mnt"), None)?;
    let fs = FsTarget {
        root: mount.mp.join(PREFIX.trim_start_matches('/')),
        direct: o.direct,
        drop_cache: !o.keep_page_cache,
    };
    fs.check(&cat)?;
    notes.push(format!("pagefs mounted at {}", mount.mp.display()));
    let mut frontend = vec![mount.pid];
    frontend.extend(&o.cpu_pids);
    Ok(Setup::new(
        "fuse",
        Target::Fs(Arc::new(fs)),
        cat,
        stack_probe(&stack, frontend),
        u64::from(o.page_size),
        notes,
    )
    .with_mount(mount)
    .with_stack(stack))
}

/// `s3 --endpoint`: an existing S3 endpoint.
fn setup_s3_endpoint(
    o: &Opts,
    endpoint: &str,
    rt: &tokio::runtime::Runtime,
    mut notes: Vec<String>,
) -> Result<Setup> {
    let bucket = o
        .bucket
        .as_deref()
        .context("s3 --endpoint needs --bucket (the first path component)")?;
    let key = o
        .access_key
        .clone()
        .or_else(|| std::env::var("AWS_ACCESS_KEY_ID").ok());
    let secret = o
        .secret_key
        .clone()
        .or_else(|| std::env::var("AWS_SECRET_ACCESS_KEY").ok());
    if key.is_none() || secret.is_none() {
        bail!(
            "s3 needs credentials: --access-key and --secret-key (or \
                         AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
        );
    }
    let url = frontends::s3_url(
        endpoint,
        bucket,
        &o.prefix,
        &o.region,
        key.as_deref(),
        secret.as_deref(),
    );
    notes.push(format!(
        "S3 endpoint {endpoint}, bucket {bucket}, prefix {:?} (object_store's S3 \
                     client)",
        o.prefix
    ));
    let table = Arc::new(MountTable::new(&[("/s3".to_string(), url)])?);
    let (target, cat) = store_target(table, "/s3", rt)?;
    Ok(Setup::new(
        "s3",
        target,
        cat,
        external_counters(o, rt)?,
        u64::from(o.page_size),
        notes,
    ))
}

/// `s3`: a local cluster behind a pages3 gateway.
fn setup_s3_local(
    o: &Opts,
    ds: &Dataset,
    rt: &tokio::runtime::Runtime,
    mut notes: Vec<String>,
) -> Result<Setup> {
    let (stack, _) = local_stack(o, "s3", ds, rt, &mut notes)?;
    let (key, secret) = ("pagebench", "pagebench-secret");
    let staging = o.dir.join("s3").join("staging");
    std::fs::create_dir_all(&staging).with_context(|| staging.display().to_string())?;
    let gw = Gateway::start(&stack.cluster, key, secret, &staging)?;
    notes.push(format!(
        "pages3 at {} (bucket {}), read with object_store's S3 client",
        gw.endpoint,
        PREFIX.trim_start_matches('/')
    ));
    let url = frontends::s3_url(
        &gw.endpoint,
        PREFIX.trim_start_matches('/'),
        "",
        "us-east-1",
        Some(key),
        Some(secret),
    );
    let table = Arc::new(MountTable::new(&[("/s3".to_string(), url)])?);
    let (target, cat) = store_target(table, "/s3", rt)?;
    let mut frontend = vec![gw.pid];
    frontend.extend(&o.cpu_pids);
    Ok(Setup::new(
        "s3",
        target,
        cat,
        stack_probe(&stack, frontend),
        u64::from(o.page_size),
        notes,
    )
    .with_gateway(gw)
    .with_stack(stack))
}

/// `client --cluster`: an existing cluster through the client library.
fn setup_client_remote(
    o: &Opts,
    c: &str,
    rt: &tokio::runtime::Runtime,
    mut notes: Vec<String>,
) -> Result<Setup> {
    let client = rt.block_on(frontends::connect(&o.cluster))?;
    let prefix = if o.prefix.is_empty() {
        PREFIX.to_string()
    } else {
        format!("/{}", o.prefix.trim_matches('/'))
    };
    notes.push(format!("cluster {c}, dataset at {prefix}"));
    let page = u64::from(client.page_size());
    let (target, cat) = client_target(client.clone(), &prefix, None, rt)?;
    Ok(Setup::new(
        "client",
        target,
        cat,
        Probe {
            counters: Some(client),
            frontend: o.cpu_pids.clone(),
            nodes: Vec::new(),
        },
        page,
        notes,
    ))
}

/// `client`: a local cluster through the client library.
fn setup_client_local(
    o: &Opts,
    ds: &Dataset,
    rt: &tokio::runtime::Runtime,
    mut notes: Vec<String>,
) -> Result<Setup> {
    let (stack, cat) = local_stack(o, "client", ds, rt, &mut notes)?;
    let (target, cat) = client_target(stack.client.clone(), PREFIX, Some(cat), rt)?;
    Ok(Setup::new(
        "client",
        target,
        cat,
        stack_probe(&stack, o.cpu_pids.clone()),
        u64::from(o.page_size),
        notes,
    )
    .with_stack(stack))
}

fn setup(o: &Opts, mode: Mode, rt: &tokio::runtime::Runtime) -> Result<Setup> {
    let notes = Vec::new();
    let ds = o.dataset();
    let mut s = match mode {
        Mode::Ufs => setup_ufs(o, &ds, rt, notes)?,
        Mode::Fuse => match &o.path {
            Some(root) => setup_fuse_path(o, root, rt, notes)?,
            None => setup_fuse_local(o, &ds, rt, notes)?,
        },
        Mode::S3 => match &o.endpoint {
            Some(endpoint) => setup_s3_endpoint(o, endpoint, rt, notes)?,
            None => setup_s3_local(o, &ds, rt, notes)?,
        },
        Mode::Client => match &o.cluster.cluster {
            Some(c) => setup_client_remote(o, c, rt, notes)?,
            None => setup_client_local(o, &ds, rt, notes)?,
        },
    };
    s.label = mode.name().into();
    if let Target::Fs(fs) = &s.target {
        s.notes.push(match (fs.direct, fs.drop_cache) {
            (true, _) => "reads with O_DIRECT: every read reaches the file system".into(),
            (false, true) => "buffered reads; each file's cached pages are dropped before each \
                              run, but a block read twice in one run may come from the kernel's \
                              page cache (--direct bypasses it)"
                .into(),
            (false, false) => "buffered reads; the kernel's cached pages are kept between runs \
                               (--keep-page-cache)"
                .into(),
        });
    }
    Ok(s)
}

/// Runs a target mode.
pub fn run_mode(o: &Opts, mode: Mode) -> Result<()> {
    let workloads: Vec<Workload> = o.new_workloads()?;
    let warning = load_warning();
    let load0 = loadavg();
    let rt = bench::runtime(2)?;
    let s = setup(o, mode, &rt)?;
    let mut results: Vec<RunResult> = Vec::new();
    for &w in &workloads {
        for &readers in &o.readers {
            let spec = Spec::from_opts(o, w, readers, s.page);
            results.push(bench::run(
                &s.label, &s.target, &s.cat, &spec, &s.probe, &rt,
            )?);
        }
    }
    let load1 = loadavg();
    if o.json {
        println!(
            "{}",
            serde_json::json!({
                "mode": mode.name(),
                "setup": s.notes,
                "dataset": s.cat.ds.to_json(),
                "load_average": {"before": load0, "after": load1},
                "warning": warning,
                "runs": results.iter().map(RunResult::to_json).collect::<Vec<_>>(),
            })
        );
        return Ok(());
    }
    if let Some(w) = &warning {
        println!("{w}");
    }
    for n in &s.notes {
        println!("{n}");
    }
    println!(
        "load average {:.2} before, {:.2} after; CPU in seconds per GB read: b = this process, \
         fe = the front end, nodes = the pagestored processes",
        load0[0], load1[0]
    );
    bench::print_table(&results);
    Ok(())
}

/// `scale --client`: the client-library workloads against one node with 1, 2, 4 ... `--shards`
/// shards (a fresh warm cluster for each count), printing throughput per shard, so that a
/// machine with more cores shows whether the served path scales like the engine.
pub fn scale_client(o: &Opts) -> Result<()> {
    let counts = crate::local::shard_counts(o.shards);
    let workloads: Vec<Workload> = o.new_workloads()?;
    let rt = bench::runtime(2)?;
    let mut rows = Vec::new();
    let mut base: std::collections::HashMap<(String, usize), f64> = Default::default();
    if !o.json {
        if let Some(w) = load_warning() {
            println!("{w}");
        }
        println!(
            "{:<10} {:>7} {:>8} {:>12} {:>12} {:>14} {:>10}",
            "workload", "shards", "readers", "MB/s", "IOPS", "MB/s per shard", "vs 1 shard"
        );
    }
    for shards in counts {
        let run = Opts {
            shards,
            nodes: Some(o.nodes.unwrap_or(1)),
            ..o.clone()
        };
        let s = setup(&run, Mode::Client, &rt)?;
        for &w in &workloads {
            for &readers in &run.readers {
                let spec = Spec::from_opts(&run, w, readers, s.page);
                let r = bench::run(&s.label, &s.target, &s.cat, &spec, &s.probe, &rt)?;
                let per = r.bw() / shards as f64;
                let first = *base.entry((r.workload.clone(), readers)).or_insert(per);
                if o.json {
                    let mut j = r.to_json();
                    j["shards"] = shards.into();
                    j["bytes_per_sec_per_shard"] = per.into();
                    j["vs_one_shard"] = (per / first).into();
                    rows.push(j);
                } else {
                    println!(
                        "{:<10} {:>7} {:>8} {:>12.1} {:>12.0} {:>14.1} {:>10.2}",
                        r.workload,
                        shards,
                        readers,
                        r.bw() / 1e6,
                        r.iops(),
                        per / 1e6,
                        per / first
                    );
                }
            }
        }
    }
    if o.json {
        println!("{}", serde_json::Value::Array(rows));
    }
    Ok(())
}
