//! `pagestored`: the pagestore daemon. One process per machine: an engine shard per core, each
//! serving its slice of the ring over QUIC and loading misses from the under storage.
//!
//! With no arguments it runs the embedded single-node default: cache in
//! `$PAGESTORE_HOME/cache`, the local directory `$PAGESTORE_HOME/data` mounted at `/data`,
//! QUIC on 127.0.0.1:7400.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{atomic::AtomicU64, Arc},
    time::Duration,
};

use pagestore_engine::EngineConfig;
use pagestore_mounts::{
    etcd::{self, ClusterState, Etcd, MemberRecord, RingMode},
    ufs::{parse_mount, FileRoots, MountTable, UfsSource},
};
use pagestore_protocol::{
    frame::{FileId, NodeEntry},
    members::{format_member_file, parse_member_file, Membership, NodeInfo},
    node_id::{self, format_uuid},
    ring::RingConfig,
    tls::NodeTls,
    transport,
};
use pagestore_server::{
    loader::LoaderOptions,
    node::{Node, NodeOptions, NodeSource},
};
use pagestore_tools::{
    admin::RingState, flag, home, init_logging, parse_size, Args, DEFAULT_LISTEN,
};

const USAGE: &str = "\
usage: pagestored [--config FILE] [OPTIONS]
                                       run a node (no options: the single-node default)
       pagestored node-id [--cache-dir DIR]
                                       print this node's UUID (created on first use)

options (each may also be set in the TOML file given with --config or PAGESTORE_CONFIG;
flags win over the file):
  --config FILE          TOML configuration (see docs/OPERATIONS.md)
  --policy lru|s3fifo    eviction policy (default lru; s3fifo resists scans)
  --cache-dir DIR        cache directory, repeatable (default $PAGESTORE_HOME/cache)
  --cache-size SIZE      cache capacity over all directories (default 1G)
  --page-size SIZE       page size, 64K..64M (default 4M)
  --shards N             engine shards (default: one per CPU)
  --mount /LOGICAL=URL   a mount, repeatable (default /data=file://$PAGESTORE_HOME/data);
                         URL: file:///dir or s3://bucket/prefix?endpoint=..&region=..
  --allow-file-root DIR  file:// mounts (from flags, config or etcd) must lie beneath one of
                         these directories, repeatable (default: the directories of this
                         node's own file:// mounts)
  --listen IP:PORT       QUIC base address; shard i uses port+i (default 127.0.0.1:7400)
  --members FILE         static member list (default: this node alone)
  --etcd URL             membership and mounts in etcd instead:
                         etcd://HOST:PORT[,HOST:PORT...][/CLUSTER] (etcds:// for TLS)
  --etcd-user USER       with etcd: log in as USER; the password comes from
                         --etcd-password-file FILE or $PAGESTORE_ETCD_PASSWORD
  --etcd-password-file FILE
                         with etcd: file holding the password (first line)
  --etcd-ca FILE         with etcds://: CA certificate(s) that sign etcd's certificate
  --etcd-cert FILE, --etcd-key FILE
                         with etcds://: client certificate and key for etcd
  --ring-mode MODE       with etcd: dynamic (live members only, the default) or static
                         (members keep their slot while down); the first node sets it
  --lease-ttl SECS       with etcd: membership lease TTL (default 10); a dead node leaves
                         the live set this long after it stops renewing
  --tls-dir DIR          TLS material (default <first cache dir>/tls)
  --require-client-cert  refuse clients without a certificate from the cluster CA (the
                         default unless --listen is a loopback address)
  --allow-anonymous      serve readers without a certificate even on a non-loopback
                         address (they may read everything the mounts hold)
  --max-connections N    connections each shard accepts at once (default 1024)
  --max-connections-per-ip N
                         connections each shard accepts from one IP address (default 128)
  --max-partial-bytes SIZE
                         request bytes the node holds for all clients together (partly
                         received and being served; default 256M, at least page size + 64K)
  --request-stall-timeout SECS
                         reset a request whose bytes stop arriving this long (default 10)
  --retry-rate N         new connections per second and shard above which clients must
                         prove their address with a QUIC Retry (default 128; 0: always)
  --metadata-ttl SECS    how long file metadata and listings are cached (default 10)
  --replicas N           replicas clients may try before the under storage (default 0)
  --ufs-inflight N       under-storage requests in flight per shard (default 16)
  --ufs-threads N        threads running under-storage requests (default 2)
  --admin IP:PORT        admin HTTP endpoint: /health, /metrics, /v1/ring (default
                         127.0.0.1:7399; port 0 picks a free one; off disables it)
  --reformat             rebuild cache files made with other settings (drops their pages)
  --no-pin               do not pin shards to CPUs
  --rule PREFIX:KEY=VALUE,...
                         a cache rule for files under PREFIX, repeatable: quota=SIZE
                         (bytes of this node's cache), ttl=DURATION (500ms, 30s, 2h, 7d),
                         pin=true; the longest prefix wins (config: [[rule]] tables)

PAGESTORE_HOME defaults to /var/tmp/pagestore; PAGESTORE_LOG sets the log level.";

struct Config {
    cache_dirs: Vec<PathBuf>,
    cache_size: u64,
    page_size: u32,
    shards: usize,
    mounts: Vec<(String, String)>,
    file_roots: FileRoots,
    listen: SocketAddr,
    members: Option<PathBuf>,
    etcd: Option<String>,
    /// Credentials and TLS settings for etcd (flags over `PAGESTORE_ETCD_*`).
    etcd_options: etcd::EtcdOptions,
    ring_mode: Option<RingMode>,
    lease_ttl: Duration,
    tls_dir: Option<PathBuf>,
    /// None: required unless the node listens on a loopback address.
    require_client_cert: Option<bool>,
    limits: pagestore_server::endpoint::Limits,
    metadata_ttl: Duration,
    replicas: u8,
    ufs_inflight: usize,
    ufs_threads: usize,
    reformat: bool,
    pin: bool,
    admin: Option<SocketAddr>,
    policy: pagestore_engine::PolicyKind,
    rules: Arc<pagestore_engine::Rules>,
}

/// The TOML configuration file: the same settings as the flags, with underscores.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    cache_dirs: Option<Vec<String>>,
    cache_size: Option<toml::Value>,
    page_size: Option<toml::Value>,
    shards: Option<u64>,
    policy: Option<String>,
    mounts: Option<std::collections::BTreeMap<String, String>>,
    allow_file_roots: Option<Vec<String>>,
    listen: Option<String>,
    members: Option<String>,
    etcd: Option<String>,
    etcd_user: Option<String>,
    etcd_password_file: Option<String>,
    etcd_ca: Option<String>,
    etcd_cert: Option<String>,
    etcd_key: Option<String>,
    ring_mode: Option<String>,
    lease_ttl: Option<f64>,
    tls_dir: Option<String>,
    require_client_cert: Option<bool>,
    max_connections: Option<u64>,
    max_connections_per_ip: Option<u64>,
    max_partial_bytes: Option<toml::Value>,
    request_stall_timeout: Option<f64>,
    retry_rate: Option<u64>,
    metadata_ttl: Option<f64>,
    replicas: Option<u64>,
    ufs_inflight: Option<u64>,
    ufs_threads: Option<u64>,
    admin: Option<String>,
    pin: Option<bool>,
    /// `[[rule]]` tables: quota, TTL and pin per logical-path prefix.
    rule: Option<Vec<pagestore_tools::rules::RuleConfig>>,
}

/// The file's settings as flags, to be parsed before the command line's (so that flags win).
/// Repeatable settings (cache directories, mounts) given on the command line replace the
/// file's instead of adding to them.
fn config_args(path: &std::path::Path, cli: &[String]) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
    let f: FileConfig =
        toml::from_str(&text).map_err(|e| format!("config file {}: {e}", path.display()))?;
    let on_cli = |name: &str| cli.iter().any(|a| flag(a) == name);
    let value = pagestore_tools::rules::scalar;
    let mut out: Vec<String> = Vec::new();
    let mut push = |k: &str, v: String| {
        out.push(k.to_string());
        out.push(v);
    };
    if !on_cli("--cache-dir") {
        for d in f.cache_dirs.unwrap_or_default() {
            push("--cache-dir", d);
        }
    }
    if !on_cli("--mount") {
        for (prefix, url) in f.mounts.unwrap_or_default() {
            push("--mount", format!("{prefix}={url}"));
        }
    }
    if !on_cli("--allow-file-root") {
        for d in f.allow_file_roots.unwrap_or_default() {
            push("--allow-file-root", d);
        }
    }
    if let Some(v) = &f.cache_size {
        push("--cache-size", value(v));
    }
    if let Some(v) = &f.page_size {
        push("--page-size", value(v));
    }
    if let Some(v) = f.shards {
        push("--shards", v.to_string());
    }
    if let Some(v) = f.policy {
        push("--policy", v);
    }
    if let Some(v) = f.listen {
        push("--listen", v);
    }
    if let Some(v) = f.members {
        push("--members", v);
    }
    if let Some(v) = f.etcd {
        push("--etcd", v);
    }
    for (k, v) in [
        ("--etcd-user", f.etcd_user),
        ("--etcd-password-file", f.etcd_password_file),
        ("--etcd-ca", f.etcd_ca),
        ("--etcd-cert", f.etcd_cert),
        ("--etcd-key", f.etcd_key),
    ] {
        if let Some(v) = v {
            push(k, v);
        }
    }
    if let Some(v) = f.ring_mode {
        push("--ring-mode", v);
    }
    if let Some(v) = f.lease_ttl {
        push("--lease-ttl", v.to_string());
    }
    if let Some(v) = f.tls_dir {
        push("--tls-dir", v);
    }
    if let Some(v) = f.metadata_ttl {
        push("--metadata-ttl", v.to_string());
    }
    if let Some(v) = f.max_connections {
        push("--max-connections", v.to_string());
    }
    if let Some(v) = f.max_connections_per_ip {
        push("--max-connections-per-ip", v.to_string());
    }
    if let Some(v) = &f.max_partial_bytes {
        push("--max-partial-bytes", value(v));
    }
    if let Some(v) = f.request_stall_timeout {
        push("--request-stall-timeout", v.to_string());
    }
    if let Some(v) = f.retry_rate {
        push("--retry-rate", v.to_string());
    }
    if let Some(v) = f.replicas {
        push("--replicas", v.to_string());
    }
    if let Some(v) = f.ufs_inflight {
        push("--ufs-inflight", v.to_string());
    }
    if let Some(v) = f.ufs_threads {
        push("--ufs-threads", v.to_string());
    }
    if let Some(v) = f.admin {
        push("--admin", v);
    }
    if let Some(required) = f.require_client_cert {
        out.push(
            if required {
                "--require-client-cert"
            } else {
                "--allow-anonymous"
            }
            .into(),
        );
    }
    if f.pin == Some(false) {
        out.push("--no-pin".into());
    }
    if !on_cli("--rule") {
        for r in f.rule.unwrap_or_default() {
            out.push("--rule".into());
            out.push(r.to_flag());
        }
    }
    Ok(out)
}

fn parse(mut args: Args) -> Result<Option<Config>, String> {
    let mut c = Config {
        cache_dirs: Vec::new(),
        cache_size: 1 << 30,
        page_size: 4 << 20,
        shards: 0,
        mounts: Vec::new(),
        file_roots: FileRoots::default(),
        listen: DEFAULT_LISTEN.parse().map_err(|e| format!("{e}"))?,
        members: None,
        etcd: None,
        etcd_options: etcd::EtcdOptions::default(),
        ring_mode: None,
        lease_ttl: etcd::DEFAULT_LEASE_TTL,
        tls_dir: None,
        require_client_cert: None,
        limits: pagestore_server::endpoint::Limits::default(),
        metadata_ttl: Duration::from_secs(10),
        replicas: 0,
        ufs_inflight: 16,
        ufs_threads: 2,
        reformat: false,
        pin: true,
        admin: Some(SocketAddr::from(([127, 0, 0, 1], 7399))),
        policy: pagestore_engine::PolicyKind::Lru,
        rules: Arc::default(),
    };
    let mut rules = Vec::new();
    let mut file_roots: Vec<PathBuf> = Vec::new();
    let mut node_id_cmd = false;
    // --etcd-user, --etcd-password-file, --etcd-ca, --etcd-cert, --etcd-key
    let mut etcd_flags: [Option<String>; 5] = Default::default();
    while let Some(arg) = args.next() {
        match flag(&arg) {
            "node-id" => node_id_cmd = true,
            "--cache-dir" => c.cache_dirs.push(args.value(&arg)?.into()),
            "--cache-size" => c.cache_size = parse_size(&args.value(&arg)?)?,
            "--page-size" => {
                c.page_size = u32::try_from(parse_size(&args.value(&arg)?)?)
                    .map_err(|_| "--page-size is at most 64M".to_string())?
            }
            "--shards" => c.shards = args.parsed(&arg)?,
            "--mount" => c
                .mounts
                .push(parse_mount(&args.value(&arg)?).map_err(|e| e.to_string())?),
            "--allow-file-root" => file_roots.push(args.value(&arg)?.into()),
            "--listen" => c.listen = args.parsed(&arg)?,
            "--members" => c.members = Some(args.value(&arg)?.into()),
            "--etcd" => {
                let v = args.value(&arg)?;
                etcd::parse_etcd_url(&v).map_err(|e| format!("--etcd: {e}"))?;
                c.etcd = Some(v);
            }
            "--etcd-user" => etcd_flags[0] = Some(args.value(&arg)?),
            "--etcd-password-file" => etcd_flags[1] = Some(args.value(&arg)?),
            "--etcd-ca" => etcd_flags[2] = Some(args.value(&arg)?),
            "--etcd-cert" => etcd_flags[3] = Some(args.value(&arg)?),
            "--etcd-key" => etcd_flags[4] = Some(args.value(&arg)?),
            "--ring-mode" => {
                c.ring_mode = Some(
                    args.value(&arg)?
                        .parse()
                        .map_err(|e| format!("--ring-mode: {e}"))?,
                )
            }
            "--lease-ttl" => {
                let v: f64 = args.parsed(&arg)?;
                if !(2.0..=3600.0).contains(&v) {
                    return Err(format!("--lease-ttl {v}: use 2 to 3600 seconds"));
                }
                c.lease_ttl = Duration::from_secs_f64(v);
            }
            "--tls-dir" => c.tls_dir = Some(args.value(&arg)?.into()),
            "--require-client-cert" => c.require_client_cert = Some(true),
            "--allow-anonymous" => c.require_client_cert = Some(false),
            "--max-connections" => c.limits.max_connections = args.parsed::<usize>(&arg)?.max(1),
            "--max-connections-per-ip" => {
                c.limits.max_connections_per_ip = args.parsed::<usize>(&arg)?.max(1)
            }
            "--max-partial-bytes" => {
                c.limits.max_partial_bytes = usize::try_from(parse_size(&args.value(&arg)?)?)
                    .map_err(|_| "--max-partial-bytes is too large".to_string())?
            }
            "--request-stall-timeout" => {
                let v: f64 = args.parsed(&arg)?;
                if !(0.1..=3600.0).contains(&v) {
                    return Err(format!(
                        "--request-stall-timeout {v}: use 0.1 to 3600 seconds"
                    ));
                }
                c.limits.request_stall_timeout = Duration::from_secs_f64(v);
            }
            "--retry-rate" => c.limits.retry_rate = args.parsed(&arg)?,
            "--metadata-ttl" => {
                c.metadata_ttl = Duration::from_secs_f64(args.parsed::<f64>(&arg)?.max(0.0))
            }
            "--replicas" => c.replicas = args.parsed(&arg)?,
            "--ufs-inflight" => c.ufs_inflight = args.parsed(&arg)?,
            "--ufs-threads" => c.ufs_threads = args.parsed::<usize>(&arg)?.max(1),
            "--reformat" => c.reformat = true,
            "--config" => {
                // Read before the other flags (see `main`).
                args.value(&arg)?;
            }
            "--policy" => {
                let v = args.value(&arg)?;
                c.policy = v
                    .parse()
                    .map_err(|_| format!("--policy {v:?}: use lru or s3fifo"))?;
            }
            "--admin" => {
                let v = args.value(&arg)?;
                c.admin = if v == "off" {
                    None
                } else {
                    Some(
                        v.parse()
                            .map_err(|e| format!("--admin {v:?}: {e} (IP:PORT or off)"))?,
                    )
                };
            }
            "--no-pin" => c.pin = false,
            "--rule" => rules.push(pagestore_tools::rules::parse_rule(&args.value(&arg)?)?),
            "-h" | "--help" | "help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            other => return Err(format!("unknown argument {other:?}\n\n{USAGE}")),
        }
    }
    if c.cache_dirs.is_empty() {
        c.cache_dirs.push(home().join("cache"));
    }
    c.rules = Arc::new(pagestore_engine::Rules::new(rules).map_err(|e| e.to_string())?);
    let max_request = c.page_size as usize + (64 << 10);
    if c.limits.max_partial_bytes < max_request {
        return Err(format!(
            "--max-partial-bytes {} cannot hold one whole request (page size + 64K = {} \
             bytes): a write of a full page could never be received",
            c.limits.max_partial_bytes, max_request
        ));
    }
    if c.members.is_some() && c.etcd.is_some() {
        return Err("--members and --etcd both name the members: choose one".into());
    }
    if c.etcd.is_none() && c.ring_mode.is_some() {
        return Err("--ring-mode needs --etcd (a member file is always a static ring)".into());
    }
    if c.etcd.is_some() {
        c.etcd_options = pagestore_tools::etcd_options(etcd_flags)?;
    } else if etcd_flags.iter().any(Option::is_some) {
        return Err(
            "--etcd-user, --etcd-password-file, --etcd-ca, --etcd-cert and --etcd-key \
                    need --etcd"
                .into(),
        );
    }
    if node_id_cmd {
        let id =
            node_id::load_or_create(&c.cache_dirs[0].join("node-id")).map_err(|e| e.to_string())?;
        println!("{}", format_uuid(id));
        return Ok(None);
    }
    if c.mounts.is_empty() {
        let data = home().join("data");
        if !data.exists() {
            std::fs::create_dir_all(&data).map_err(|e| {
                format!(
                    "cannot create the default data directory {}: {e}",
                    data.display()
                )
            })?;
            // Something to read on a fresh machine: `pagectl cat /data/README.txt`.
            let _ = std::fs::write(
                data.join("README.txt"),
                "This directory is mounted at /data by the default pagestored.\n\
                 Put files here and read them through the cache: pagectl cat /data/NAME\n",
            );
        }
        c.mounts
            .push(("/data".to_string(), format!("file://{}", data.display())));
    }
    c.file_roots = if file_roots.is_empty() {
        // By default, the directories of this node's own file:// mounts (those that exist; a
        // missing one fails with its mount).
        let own: Vec<PathBuf> = c
            .mounts
            .iter()
            .filter_map(|(_, u)| pagestore_mounts::ufs::local_dir(u))
            .filter(|d| d.is_dir())
            .collect();
        FileRoots::new(&own).map_err(|e| e.to_string())?
    } else {
        FileRoots::new(&file_roots).map_err(|e| e.to_string())?
    };
    Ok(Some(c))
}

fn main() {
    init_logging();
    let cli: Vec<String> = std::env::args().skip(1).collect();
    let config = cli
        .iter()
        .position(|a| flag(a) == "--config")
        .and_then(|i| match cli[i].split_once('=') {
            Some((_, v)) => Some(v.to_string()),
            None => cli.get(i + 1).cloned(),
        })
        .or_else(|| std::env::var("PAGESTORE_CONFIG").ok());
    let args = match config {
        None => Ok(cli),
        Some(path) => config_args(path.as_ref(), &cli).map(|mut a| {
            a.extend(cli);
            a
        }),
    };
    match args
        .and_then(|a| parse(Args::from_vec(a)))
        .and_then(|c| c.map_or(Ok(()), run))
    {
        Ok(()) => {}
        Err(e) => {
            eprintln!("pagestored: {e}");
            std::process::exit(2);
        }
    }
}

fn run(mut c: Config) -> Result<(), String> {
    for d in &c.cache_dirs {
        std::fs::create_dir_all(d)
            .map_err(|e| format!("cannot create cache directory {}: {e}", d.display()))?;
    }
    let first = &c.cache_dirs[0];
    let id = node_id::load_or_create(&first.join("node-id")).map_err(|e| e.to_string())?;
    let tls_dir = c.tls_dir.clone().unwrap_or_else(|| first.join("tls"));
    let tls = NodeTls::load_or_create(&tls_dir, &format_uuid(id)).map_err(|e| e.to_string())?;
    let engine = EngineConfig {
        cache_dirs: c.cache_dirs.clone(),
        capacity: c.cache_size,
        page_size: c.page_size,
        shards: c.shards,
        pin_cpus: c.pin,
        reformat: c.reformat,
        policy: c.policy,
        rules: c.rules.clone(),
        ..EngineConfig::default()
    };
    let shards = engine.resolved_shards();
    let me = NodeInfo {
        id,
        addr: c.listen,
        shards: u16::try_from(shards).map_err(|_| "too many shards".to_string())?,
    };
    if (c.members.is_some() || c.etcd.is_some()) && c.listen.ip().is_unspecified() {
        return Err(format!(
            "--listen {} is not an address other machines can reach: members and clients \
             connect to the address the node registers, so listen on this node's own IP",
            c.listen
        ));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(c.ufs_threads)
        .thread_name("pagestored-ufs")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the tokio runtime: {e}"))?;
    // This node's own mounts, with their credentials (etcd's table holds none).
    let local_mounts = c.mounts.clone();
    // Membership: etcd, a member file, or this node alone.
    let mut etcd_state: Option<(Arc<Etcd>, ClusterState)> = None;
    let nodes = match (&c.members, &c.etcd) {
        (_, Some(url)) => {
            let e = {
                let _guard = runtime.enter();
                Arc::new(Etcd::new(url, &c.etcd_options).map_err(|e| format!("--etcd: {e}"))?)
            };
            let (state, mounts) = runtime.block_on(etcd_join(&e, &c)).map_err(|e| match e {
                etcd::EtcdError::Auth(_) => {
                    format!("{e} (check --etcd-user and the password for --etcd {url})")
                }
                _ => format!("{e} (check --etcd {url} and that etcd runs)"),
            })?;
            let own: Vec<(String, String)> = c
                .mounts
                .iter()
                .map(|(p, u)| (p.clone(), pagestore_mounts::ufs::redact(u)))
                .collect();
            if own != mounts {
                tracing::warn!("the mount table in etcd differs from this node's settings; etcd's wins (change it with pagectl mount)");
            }
            for (p, u) in &mounts {
                if !etcd::credentials_in(u).is_empty() {
                    tracing::warn!(prefix = %p, "a mount URL in etcd holds credentials: set it again without them (pagectl mount set)");
                }
            }
            // etcd holds no secrets: this node's own credentials go back on its mounts.
            c.mounts = etcd::with_local_credentials(&mounts, &local_mounts);
            let mut state = state;
            let rec = MemberRecord {
                info: me,
                admin: None,
            };
            // This node is about to register: start with it in the ring.
            state.live.insert(id, rec.clone());
            state.slots.insert(id, rec);
            let nodes = state.ring_nodes();
            etcd_state = Some((e, state));
            nodes
        }
        (None, None) => vec![me],
        (Some(path), None) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read member file {}: {e}", path.display()))?;
            let nodes = parse_member_file(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            match nodes.iter().find(|n| n.id == id) {
                Some(n) if *n == me => {}
                Some(n) => {
                    return Err(format!(
                        "{} lists this node ({}) at {} with {} shards, but it runs at {} with {} \
                         shards; fix the file or the flags",
                        path.display(),
                        format_uuid(id),
                        n.addr,
                        n.shards,
                        me.addr,
                        me.shards
                    ))
                }
                None => {
                    return Err(format!(
                        "{} does not list this node; add the line:\n{}",
                        path.display(),
                        format_member_file(&[me]).lines().nth(1).unwrap_or_default()
                    ))
                }
            }
            nodes
        }
    };
    let epoch = etcd_state.as_ref().map_or(1, |(_, s)| s.revision.max(1));
    let membership = Membership::new(nodes.iter().copied(), RingConfig::default(), epoch)
        .map_err(|e| e.to_string())?;
    let mounts = {
        let _guard = runtime.enter();
        MountTable::new_confined(&c.mounts, &c.file_roots).map_err(|e| e.to_string())?
    };
    let source = Arc::new(UfsSource::new(Arc::new(mounts)));
    // Anonymous readers may read everything the mounts hold: by default only on a loopback
    // address (a single machine's own users), never on a network unless asked for.
    let require_client_cert = c
        .require_client_cert
        .unwrap_or(!c.listen.ip().is_loopback());
    let rustls = pagestore_protocol::tls::server_config(
        &tls.identity,
        &tls.ca,
        require_client_cert,
        pagestore_protocol::frame::ALPN,
    )
    .map_err(|e| e.to_string())?;
    let crypto = quinn_proto::crypto::rustls::QuicServerConfig::try_from(rustls)
        .map_err(|e| format!("TLS: {e}"))?;
    let mut server = quinn_proto::ServerConfig::with_crypto(Arc::new(crypto));
    server.transport_config(transport::transport_config());
    let node = Node::start(
        engine,
        NodeOptions {
            listen: c.listen,
            server: Arc::new(server),
            node_id: id,
            ring: Arc::new(membership.ring().clone()),
            max_request: c.page_size as usize + (64 << 10),
            // One connection may hold up to 4 pages of writes from the node's budget.
            max_buffered: 4 * (c.page_size as usize + (64 << 10)),
            limits: c.limits.clone(),
            source: Some(NodeSource {
                source: source.clone(),
                runtime: runtime.handle().clone(),
                options: LoaderOptions {
                    max_inflight: c.ufs_inflight,
                    metadata_ttl: c.metadata_ttl,
                    ..LoaderOptions::default()
                },
            }),
            nodes: node_entries(&membership),
            replicas: c.replicas,
        },
    )
    .map_err(|e| e.to_string())?;
    let node = Arc::new(node);
    let admin = Arc::new(pagestore_tools::admin::Admin {
        node: Arc::downgrade(&node),
        ring: std::sync::RwLock::new(RingState {
            membership: Arc::new(membership.clone()),
            down: Vec::new(),
            mode: etcd_state
                .as_ref()
                .map_or("file", |(_, s)| s.mode().as_str()),
        }),
        etcd: etcd_state.as_ref().map(|(e, _)| e.clone()),
    });
    let admin_addr = match c.admin {
        None => None,
        Some(addr) => Some(
            runtime
                .block_on(pagestore_tools::admin::serve(admin.clone(), addr))
                .map_err(|e| {
                    format!(
                        "cannot serve the admin endpoint on {addr}: {e} (choose another with \
                         --admin IP:PORT, or --admin off)"
                    )
                })?,
        ),
    };
    // With etcd: register under a lease, keep it alive, and follow membership changes.
    let mut background = Vec::new();
    let lease = Arc::new(AtomicU64::new(0));
    if let Some((e, state)) = &etcd_state {
        let rec = MemberRecord {
            info: me,
            admin: admin_addr.map(|a| a.to_string()),
        };
        let l = runtime
            .block_on(e.register(&rec, c.lease_ttl))
            .map_err(|err| format!("cannot register in etcd: {err}"))?;
        lease.store(l, std::sync::atomic::Ordering::Relaxed);
        let _guard = runtime.enter();
        background.push(etcd::keep_registered(
            e.clone(),
            rec,
            c.lease_ttl,
            lease.clone(),
        ));
        let (tx, mut rx) = tokio::sync::watch::channel::<Option<ClusterState>>(None);
        background.push(etcd::follow(e.clone(), Some(state.clone()), move |s| {
            tx.send_replace(Some(s.clone()));
            true
        }));
        let (weak, admin, source) = (Arc::downgrade(&node), admin.clone(), source.clone());
        let roots = c.file_roots.clone();
        let local_mounts = local_mounts.clone();
        background.push(runtime.spawn(async move {
            while rx.changed().await.is_ok() {
                let Some(s) = rx.borrow_and_update().clone() else {
                    continue;
                };
                let Some(node) = weak.upgrade() else {
                    return;
                };
                apply_state(&node, &admin, &source, &s, &roots, &local_mounts).await;
            }
        }));
    }
    let last_port = c.listen.port().saturating_add(me.shards - 1);
    println!(
        "pagestored: node {} serving {} shard(s) on {} (UDP ports {}-{})",
        format_uuid(id),
        shards,
        c.listen.ip(),
        c.listen.port(),
        last_port
    );
    for d in &c.cache_dirs {
        println!(
            "  cache      {} ({} bytes over all directories)",
            d.display(),
            c.cache_size
        );
    }
    for (prefix, url) in source.table().mounts() {
        println!(
            "  mount      {} <- {}",
            if prefix.is_empty() { "/" } else { prefix },
            pagestore_mounts::ufs::redact(url)
        );
    }
    for (_, rule) in c.rules.iter() {
        println!("  rule       {}", pagestore_tools::rules::describe(rule));
    }
    println!(
        "  tls        {} ({})",
        tls_dir.display(),
        if require_client_cert {
            "clients need a certificate from the cluster CA"
        } else {
            "readers without a certificate allowed"
        }
    );
    if let Some(a) = admin_addr {
        println!("  admin      http://{a}/metrics");
    }
    match (&etcd_state, &c.members) {
        (Some((_, s)), _) => println!(
            "  members    {} node(s) in the {} ring, from {} (lease TTL {:?})",
            membership.nodes().count(),
            s.mode().as_str(),
            c.etcd.as_deref().unwrap_or_default(),
            c.lease_ttl
        ),
        (None, Some(p)) => println!(
            "  members    {} node(s) from {}",
            membership.nodes().count(),
            p.display()
        ),
        (None, None) => println!("  members    this node alone"),
    }
    println!("ready: try `pagectl ls /` (stop with Ctrl-C)");
    let signal = runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => Ok::<_, String>("SIGINT"),
            _ = term.recv() => Ok("SIGTERM"),
        }
    })?;
    tracing::info!(
        signal,
        "shutting down: closing connections, persisting the index"
    );
    for t in &background {
        t.abort();
    }
    if let Some((e, _)) = &etcd_state {
        // Leave the live set now rather than when the lease runs out.
        let l = lease.load(std::sync::atomic::Ordering::Relaxed);
        let revoke = async { tokio::time::timeout(Duration::from_secs(2), e.revoke(l)).await };
        match runtime.block_on(revoke) {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "could not leave etcd; the lease will expire")
            }
            Err(_) => tracing::warn!("etcd did not answer; the lease will expire"),
        }
    }
    // The node first (in-flight requests may still need the under-storage runtime), then the
    // runtime. The admin endpoint and the membership task hold only weak references; wait
    // for a membership update that is being applied right now.
    let mut node = node;
    let node = loop {
        match Arc::try_unwrap(node) {
            Ok(n) => break n,
            Err(n) if Arc::weak_count(&n) > 0 => {
                node = n;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => return Err("shutdown: the node is still in use".to_string()),
        }
    };
    node.shutdown().map_err(|e| format!("shutdown: {e}"))?;
    runtime.shutdown_timeout(Duration::from_secs(5));
    println!("pagestored: stopped");
    Ok(())
}

/// Joins the cluster in etcd: sets the ring mode and mount table if this is the first node,
/// and reads the state. Returns the state and the mount table in force.
async fn etcd_join(
    e: &Etcd,
    c: &Config,
) -> Result<(ClusterState, Vec<(String, String)>), etcd::EtcdError> {
    let wanted = c.ring_mode.unwrap_or(RingMode::Dynamic);
    let mode = e.init_ring_mode(wanted).await?;
    if c.ring_mode.is_some() && mode != wanted {
        tracing::warn!(
            cluster = mode.as_str(),
            asked = wanted.as_str(),
            "the cluster's ring mode is already set in etcd; using it"
        );
    }
    let mounts = e.init_mounts(&c.mounts).await?;
    Ok((e.state().await?, mounts))
}

fn node_entries(m: &Membership) -> Vec<NodeEntry> {
    m.nodes()
        .map(|n| NodeEntry {
            id: FileId::from_u128(n.id),
            addr: n.addr.to_string(),
            shards: n.shards,
        })
        .collect()
}

/// Serves under a membership state read from etcd: the shards' rings, the admin view and
/// the mount table (with this node's own credentials, `local_mounts`, put back).
async fn apply_state(
    node: &Node,
    admin: &pagestore_tools::admin::Admin,
    source: &UfsSource,
    s: &ClusterState,
    roots: &FileRoots,
    local_mounts: &[(String, String)],
) {
    let nodes = s.ring_nodes();
    if nodes.is_empty() {
        tracing::warn!("etcd lists no ring members (not even this node); keeping the last ring");
        return;
    }
    let membership = match Membership::new(nodes, RingConfig::default(), s.revision.max(1)) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring a membership change");
            return;
        }
    };
    if let Err(e) = node
        .set_ring(
            Arc::new(membership.ring().clone()),
            Arc::new(node_entries(&membership)),
        )
        .await
    {
        tracing::warn!(error = %e, "cannot give the shards the new ring");
        return;
    }
    tracing::info!(
        epoch = s.revision,
        nodes = membership.nodes().count(),
        down = s.down().len(),
        mode = s.mode().as_str(),
        "membership changed"
    );
    *admin.ring.write().unwrap_or_else(|p| p.into_inner()) = RingState {
        membership: Arc::new(membership),
        down: s.down(),
        mode: s.mode().as_str(),
    };
    let current = source.table();
    let mut now: Vec<(String, String)> = current
        .mounts()
        .map(|(p, u)| (p.to_string(), u.to_string()))
        .collect();
    let mut wanted = etcd::with_local_credentials(&s.mounts, local_mounts);
    now.sort();
    wanted.sort();
    if !wanted.is_empty() && wanted != now {
        match MountTable::new_confined(&wanted, roots) {
            Ok(t) => {
                source.replace(Arc::new(t));
                tracing::info!(
                    mounts = s.mounts.len(),
                    "mount table changed in etcd; applied"
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "ignoring a mount table from etcd that does not open")
            }
        }
    }
}
