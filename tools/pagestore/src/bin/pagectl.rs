//! `pagectl`: the pagestore command line: read files and list directories through the
//! cluster, and manage cluster certificates.

use std::{io::Write, path::PathBuf, sync::Arc};

use pagestore_client::{tls, Client, ClientOptions, ClusterSource, Error};
use pagestore_protocol::{
    frame::PathKind,
    tls::{ClusterCa, Role},
};
use pagestore_tools::{flag, home, init_logging, Args, DEFAULT_LISTEN};
use tokio::io::AsyncReadExt;

const USAGE: &str = "\
usage: pagectl [OPTIONS] COMMAND

commands:
  cat PATH...        write files to standard output
  ls [-l] PATH       list a directory (or show one file)
  stat [PATH]        without PATH: nodes, shards, capacity, use, hit ratio and read bandwidth
                     (sampled over --interval SECS, default 1) of the cluster, and the last
                     preload job's time to its first page; with PATH: size, version, file id
                     and pages of a path
  ring               each node's and shard's share of the ring
  head [-n LINES] PATH
                     the first lines of a file (default 10)
  load (--manifest FILE | --prefix PATH) [--parallel N] [--verify]
                     preload files into the cache: a manifest lists one logical path per line
                     (or JSON lines with a \"path\" field; FILE may be a local file or a path in
                     the namespace); --prefix takes every file under a directory. Pages already
                     cached are skipped. --verify also compares every cached page with the
                     under storage and reloads what differs. Runs until the job is done.
  jobs               past and running preload jobs (the nodes keep the last 100)
  free PATH          drop every cached page of the files under PATH (a directory or a file);
                     the under storage is not touched
  members            (etcd) live members and ring slots, and the ring mode
  node remove UUID   (etcd) remove a member's ring slot: a permanent departure (static ring);
                     stop the node first
  mount ls           (etcd) the mount table
  mount set /PREFIX URL
                     (etcd) add or change a mount; nodes apply it within seconds. The URL
                     holds no credentials (they would be readable in etcd): nodes add their
                     own, from a --mount of the same prefix and URL or their environment
  mount rm /PREFIX   (etcd) remove a mount
  ca-init DIR        create a cluster CA (ca-cert.pem, ca-key.pem) in DIR; copy both files into
                     each node's TLS directory before its first start to form one cluster
  cert issue --role ROLE [--name NAME] DIR
                     issue a client certificate signed by the cluster CA in --tls-dir (which
                     must hold ca-key.pem) into DIR (client-cert.pem, client-key.pem 0600, and
                     ca-cert.pem): give DIR to a client as its --tls-dir. ROLE is reader (read
                     only), writer (also store pages, invalidate, job records) or admin (also
                     drop cached files); see docs/SECURITY.md

options:
  --cluster WHERE         a member file, any member's IP:PORT, or etcd://HOST:PORT[/CLUSTER]
                          (etcds:// for TLS; default $PAGESTORE_CLUSTER or 127.0.0.1:7400).
                          Readers need no etcd: a member's address follows membership too
  --etcd-user USER        log in to etcd as USER (or $PAGESTORE_ETCD_USER); the password
                          comes from --etcd-password-file FILE or $PAGESTORE_ETCD_PASSWORD
  --etcd-password-file FILE
                          file holding the etcd password (first line)
  --etcd-ca FILE          with etcds://: CA certificate(s) that sign etcd's certificate
  --etcd-cert FILE, --etcd-key FILE
                          with etcds://: client certificate and key for etcd
  --tls-dir DIR           directory with the cluster's ca-cert.pem (and client-cert.pem and
                          client-key.pem, or ca-key.pem, if the cluster requires client
                          certificates); default $PAGESTORE_TLS_DIR or $PAGESTORE_HOME/cache/tls
  --no-fallback           fail instead of reading the under storage when a member is down
  --timeout SECS          time allowed per request to a member (default 3)";

fn main() {
    init_logging();
    let code = match real_main() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("pagectl: {e}");
            1
        }
    };
    std::process::exit(code);
}

fn real_main() -> Result<(), String> {
    let mut args = Args::from_env();
    let mut cluster = std::env::var("PAGESTORE_CLUSTER").unwrap_or_else(|_| DEFAULT_LISTEN.into());
    let mut tls_dir = std::env::var_os("PAGESTORE_TLS_DIR")
        .map_or_else(|| home().join("cache").join("tls"), PathBuf::from);
    let mut options = ClientOptions::default();
    let mut words = Vec::new();
    let mut long = false;
    let mut lines: usize = 10;
    let mut manifest = None;
    let mut prefix = None;
    let mut load_opts = pagestore_tools::load::LoadOptions::default();
    let mut interval = std::time::Duration::from_secs(1);
    let mut role = None;
    let mut name = None;
    // --etcd-user, --etcd-password-file, --etcd-ca, --etcd-cert, --etcd-key
    let mut etcd_flags: [Option<String>; 5] = Default::default();
    while let Some(arg) = args.next() {
        match flag(&arg) {
            "--cluster" => cluster = args.value(&arg)?,
            "--etcd-user" => etcd_flags[0] = Some(args.value(&arg)?),
            "--etcd-password-file" => etcd_flags[1] = Some(args.value(&arg)?),
            "--etcd-ca" => etcd_flags[2] = Some(args.value(&arg)?),
            "--etcd-cert" => etcd_flags[3] = Some(args.value(&arg)?),
            "--etcd-key" => etcd_flags[4] = Some(args.value(&arg)?),
            "--tls-dir" => tls_dir = args.value(&arg)?.into(),
            "--no-fallback" => options.fallback = false,
            "--interval" => {
                interval =
                    std::time::Duration::from_secs_f64(args.parsed::<f64>(&arg)?.clamp(0.0, 3600.0))
            }
            "--timeout" => {
                options.call_timeout =
                    std::time::Duration::from_secs_f64(args.parsed::<f64>(&arg)?.max(0.01))
            }
            "-l" => long = true,
            "-n" => lines = args.parsed(&arg)?,
            "--manifest" => manifest = Some(args.value(&arg)?),
            "--prefix" => prefix = Some(args.value(&arg)?),
            "--parallel" => load_opts.parallel = args.parsed(&arg)?,
            "--verify" => load_opts.verify = true,
            "--role" => {
                let v = args.value(&arg)?;
                role = Some(Role::parse(&v).ok_or_else(|| {
                    format!("--role {v:?}: expected reader, writer, admin or node")
                })?)
            }
            "--name" => name = Some(args.value(&arg)?),
            "--wait" => {}
            "-h" | "--help" | "help" => {
                println!("{USAGE}");
                return Ok(());
            }
            f if f.starts_with("--") => return Err(format!("unknown option {f:?}\n\n{USAGE}")),
            _ => words.push(arg),
        }
    }
    let Some((command, rest)) = words.split_first() else {
        return Err(format!("no command\n\n{USAGE}"));
    };
    if command == "ca-init" {
        let [dir] = rest else {
            return Err("usage: pagectl ca-init DIR".into());
        };
        return ca_init(dir.into());
    }
    if command == "cert" {
        let words: Vec<&str> = rest.iter().map(String::as_str).collect();
        let (["issue", dir], Some(role)) = (words.as_slice(), role) else {
            return Err(
                "usage: pagectl cert issue --role reader|writer|admin [--name NAME] DIR".into(),
            );
        };
        let name = name.unwrap_or_else(|| format!("pagestore {role}"));
        return cert_issue(&tls_dir, dir.into(), role, &name);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let is_etcd = pagestore_client::etcd::is_etcd_url(&cluster);
    if !is_etcd && etcd_flags.iter().any(Option::is_some) {
        return Err(
            "--etcd-user, --etcd-password-file, --etcd-ca, --etcd-cert and --etcd-key \
                    need --cluster etcd://... (or etcds://)"
                .into(),
        );
    }
    let etcd_options = if is_etcd {
        Some(pagestore_tools::etcd_options(etcd_flags)?)
    } else {
        None
    };
    if matches!(command.as_str(), "members" | "node" | "mount") {
        let opts = etcd_options.unwrap_or_default();
        return runtime.block_on(etcd_command(&cluster, &opts, command, rest));
    }
    options.etcd = etcd_options;
    runtime.block_on(async {
        let tls = tls::client_config(&tls_dir).map_err(|e| e.to_string())?;
        let client = Client::connect(&ClusterSource::parse(&cluster), tls, None, options)
            .await
            .map_err(|e| e.to_string())?;
        match (command.as_str(), rest) {
            ("cat", paths) if !paths.is_empty() => {
                for p in paths {
                    cat(&client, p).await?;
                }
                Ok(())
            }
            ("ls", [path]) => ls(&client, path, long).await,
            ("ls", []) => ls(&client, "/", long).await,
            ("stat", [path]) => stat(&client, path).await,
            ("stat", []) => cluster_stat(&client, interval).await,
            ("ring", []) => ring(&client),
            ("free", [path]) => free(&client, path).await,
            ("head", [path]) => head(&client, path, lines).await,
            ("load", []) => load(&client, manifest, prefix, &load_opts).await,
            ("jobs", []) => jobs(&client).await,
            _ => Err(format!("bad command {words:?}\n\n{USAGE}")),
        }
    })
}

fn ca_init(dir: PathBuf) -> Result<(), String> {
    let (cert, key) = (dir.join("ca-cert.pem"), dir.join("ca-key.pem"));
    if cert.exists() || key.exists() {
        return Err(format!(
            "{} already holds a CA; remove it first if you really want a new one",
            dir.display()
        ));
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let ca = ClusterCa::generate(pagestore_protocol::tls::CA_NAME).map_err(|e| e.to_string())?;
    ca.save(&cert, &key).map_err(|e| e.to_string())?;
    println!("wrote {} and {}", cert.display(), key.display());
    Ok(())
}

/// Issues a client certificate with `role` from the CA in `tls_dir` and writes it, with the CA
/// certificate, into `dir` (a TLS directory a client can use as it is).
fn cert_issue(
    tls_dir: &std::path::Path,
    dir: PathBuf,
    role: Role,
    name: &str,
) -> Result<(), String> {
    let (ca_cert, ca_key) = (tls_dir.join("ca-cert.pem"), tls_dir.join("ca-key.pem"));
    if !ca_key.exists() {
        return Err(format!(
            "{} does not exist: run this where the cluster CA's key is (a node's TLS directory, \
             or the directory given to pagectl ca-init), with --tls-dir pointing at it",
            ca_key.display()
        ));
    }
    let ca = ClusterCa::load(&ca_cert, &ca_key).map_err(|e| e.to_string())?;
    let (cert, key) = (dir.join("client-cert.pem"), dir.join("client-key.pem"));
    if cert.exists() || key.exists() {
        return Err(format!(
            "{} already holds a client certificate; remove it first",
            dir.display()
        ));
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let id = ca.issue(name, role).map_err(|e| e.to_string())?;
    pagestore_protocol::tls::save_identity(&id, &cert, &key).map_err(|e| e.to_string())?;
    let ca_copy = dir.join("ca-cert.pem");
    if ca_copy != ca_cert {
        std::fs::copy(&ca_cert, &ca_copy).map_err(|e| format!("{}: {e}", ca_copy.display()))?;
    }
    println!(
        "wrote a {role} certificate for {name:?}: {} and {} (with {}); use --tls-dir {}",
        cert.display(),
        key.display(),
        ca_copy.display(),
        dir.display()
    );
    Ok(())
}

async fn cat(client: &Arc<Client>, path: &str) -> Result<(), String> {
    let mut f = client.open(path).await.map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; client.page_size() as usize];
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    loop {
        let n = f.read(&mut buf).await.map_err(|e| format!("{path}: {e}"))?;
        if n == 0 {
            break;
        }
        match out.write_all(&buf[..n]) {
            Ok(()) => {}
            // `pagectl cat f | head` is not an error.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(format!("writing standard output: {e}")),
        }
    }
    match out.flush() {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(format!("writing standard output: {e}"))
        }
        _ => Ok(()),
    }
}

async fn ls(client: &Client, path: &str, long: bool) -> Result<(), String> {
    let entries = match client.list(path).await {
        Ok(e) => e,
        Err(Error::NotDir(_)) => {
            let info = client.stat(path).await.map_err(|e| e.to_string())?;
            println!(
                "{}",
                if long {
                    format!("{:>14}  {path}", info.size)
                } else {
                    path.into()
                }
            );
            return Ok(());
        }
        Err(e) => return Err(e.to_string()),
    };
    let mut out = String::new();
    for e in entries {
        let name = if e.is_dir {
            format!("{}/", e.name)
        } else {
            e.name
        };
        if long {
            out.push_str(&format!(
                "{:>14}  {name}\n",
                if e.is_dir { 0 } else { e.size }
            ));
        } else {
            out.push_str(&name);
            out.push('\n');
        }
    }
    let _ = std::io::stdout().write_all(out.as_bytes());
    Ok(())
}

async fn load(
    client: &Arc<Client>,
    manifest: Option<String>,
    prefix: Option<String>,
    opts: &pagestore_tools::load::LoadOptions,
) -> Result<(), String> {
    use pagestore_tools::load;
    let t0 = std::time::Instant::now();
    let mut opts = opts.clone();
    opts.source = match (&manifest, &prefix) {
        (Some(m), _) => format!("manifest {m}"),
        (_, Some(p)) => format!("prefix {p}"),
        _ => String::new(),
    };
    let opts = &opts;
    let paths = match (manifest, prefix) {
        (Some(m), None) => {
            let text = if std::path::Path::new(&m).exists() || !m.starts_with('/') {
                std::fs::read_to_string(&m).map_err(|e| format!("manifest {m}: {e}"))?
            } else {
                let b = client
                    .read(&m, 0..u64::MAX)
                    .await
                    .map_err(|e| format!("manifest {m}: {e}"))?;
                String::from_utf8(b.to_vec()).map_err(|_| format!("manifest {m}: not UTF-8"))?
            };
            load::parse_manifest(&text)?
        }
        (None, Some(p)) => load::walk(client, &p).await?,
        _ => return Err("load needs exactly one of --manifest FILE or --prefix PATH".into()),
    };
    let resolve = t0.elapsed().as_secs_f64();
    eprintln!(
        "job {}: {} files (resolved in {resolve:.2} s); see pagectl jobs",
        opts.id,
        paths.len()
    );
    let mut r = load::run_job(client.clone(), paths, opts).await;
    r.resolve_secs = resolve;
    println!(
        "loaded {} pages ({:.1} MB) from the under storage, {} pages were cached already; \
         {} of {} files failed",
        r.pages_loaded,
        r.bytes_loaded as f64 / 1e6,
        r.pages_present,
        r.failed,
        r.files
    );
    println!(
        "time to first page {}; to completion {:.2} s ({:.1} MB/s over {:.1} MB)",
        r.first_page_secs
            .map_or("-".into(), |s| format!("{:.3} s", s + resolve)),
        r.total_secs + resolve,
        r.bytes_total as f64 / 1e6 / r.total_secs.max(1e-3),
        r.bytes_total as f64 / 1e6
    );
    if opts.verify {
        println!(
            "verify: {} pages compared with the under storage; {} files repaired",
            r.pages_verified, r.repaired
        );
    }
    for (p, why) in &r.failures {
        eprintln!("failed: {p}: {why}");
    }
    if r.failed > 0 {
        return Err(format!("{} files failed", r.failed));
    }
    Ok(())
}

/// Past and running preload jobs, as the nodes keep their records.
async fn jobs(client: &Client) -> Result<(), String> {
    let records = client.jobs().await.map_err(|e| e.to_string())?;
    if records.is_empty() {
        println!("no preload jobs recorded (nodes keep the last 100 in memory)");
        return Ok(());
    }
    println!(
        "{:<30} {:<9} {:>13} {:>10} {:>10} {:>9} {:>9}  source",
        "job", "state", "files", "GB", "loaded GB", "1st page", "elapsed"
    );
    let now = pagestore_tools::load::unix_now();
    for r in &records {
        let state = pagestore_tools::load::job_state(r, now);
        println!(
            "{:<30} {:<9} {:>13} {:>10.2} {:>10.2} {:>9} {:>8.1}s  {}",
            r.id,
            state,
            format!(
                "{}/{}{}",
                r.files_done,
                r.files_total,
                match r.files_failed {
                    0 => String::new(),
                    n => format!(" ({n}!)"),
                }
            ),
            r.bytes_done as f64 / 1e9,
            r.bytes_loaded as f64 / 1e9,
            r.first_page_secs.map_or("-".into(), |s| format!("{s:.3}s")),
            r.elapsed_secs,
            r.source
        );
    }
    Ok(())
}

/// Bytes a node served from its cache and read from the under storage per second, from two
/// samples of its shards' counters `interval` apart.
async fn node_rates(
    client: &Client,
    interval: std::time::Duration,
) -> std::collections::HashMap<u128, (f64, f64)> {
    let sum = |v: &[(
        pagestore_protocol::members::NodeInfo,
        u16,
        Option<pagestore_client::ShardCounters>,
    )]| {
        let mut m: std::collections::HashMap<u128, (u64, u64)> = Default::default();
        for (n, _, c) in v {
            if let Some(c) = c {
                let e = m.entry(n.id).or_default();
                e.0 += c.hit_bytes;
                e.1 += c.ufs_bytes;
            }
        }
        m
    };
    let t0 = std::time::Instant::now();
    let a = sum(&client.shard_counters().await);
    tokio::time::sleep(interval).await;
    let b = sum(&client.shard_counters().await);
    let secs = t0.elapsed().as_secs_f64().max(1e-3);
    b.iter()
        .filter_map(|(id, (h1, u1))| {
            let (h0, u0) = a.get(id)?;
            Some((
                *id,
                (
                    h1.saturating_sub(*h0) as f64 / secs,
                    u1.saturating_sub(*u0) as f64 / secs,
                ),
            ))
        })
        .collect()
}

async fn cluster_stat(client: &Client, interval: std::time::Duration) -> Result<(), String> {
    let rates = node_rates(client, interval).await;
    let stats = client.shard_stats().await;
    let gb = |b: u64| b as f64 / 1e9;
    println!(
        "{:<38} {:<22} {:>6} {:>10} {:>10} {:>6} {:>9} {:>10} {:>10}",
        "node",
        "address",
        "shards",
        "capacity",
        "used",
        "used%",
        "hit ratio",
        "cache MB/s",
        "UFS MB/s"
    );
    let (mut cache_rate, mut ufs_rate) = (0.0, 0.0);
    let mut total = pagestore_client::ShardStat::default();
    let mut down = 0;
    let membership = client.membership();
    for n in membership.nodes() {
        let mine: Vec<_> = stats.iter().filter(|(m, _, _)| m.id == n.id).collect();
        let mut c = pagestore_client::ShardStat::default();
        let mut answered = 0;
        for (_, _, s) in &mine {
            if let Some(s) = s {
                answered += 1;
                c.pages += s.pages;
                c.bytes += s.bytes;
                c.capacity_bytes += s.capacity_bytes;
                c.hits += s.hits;
                c.misses += s.misses;
            }
        }
        if answered == 0 {
            down += 1;
            println!(
                "{:<38} {:<22} {:>6} {:>10}",
                pagestore_protocol::node_id::format_uuid(n.id),
                n.addr,
                n.shards,
                "DOWN"
            );
            continue;
        }
        let lookups = c.hits + c.misses;
        let (cr, ur) = rates.get(&n.id).copied().unwrap_or_default();
        cache_rate += cr;
        ufs_rate += ur;
        println!(
            "{:<38} {:<22} {:>6} {:>8.2}GB {:>8.2}GB {:>5.1}% {:>9} {:>10.1} {:>10.1}",
            pagestore_protocol::node_id::format_uuid(n.id),
            n.addr,
            format!("{answered}/{}", n.shards),
            gb(c.capacity_bytes),
            gb(c.bytes),
            100.0 * c.bytes as f64 / c.capacity_bytes.max(1) as f64,
            if lookups == 0 {
                "-".to_string()
            } else {
                format!("{:.1}%", 100.0 * c.hits as f64 / lookups as f64)
            },
            cr / 1e6,
            ur / 1e6
        );
        total.pages += c.pages;
        total.bytes += c.bytes;
        total.capacity_bytes += c.capacity_bytes;
        total.hits += c.hits;
        total.misses += c.misses;
    }
    let lookups = total.hits + total.misses;
    println!(
        "cluster: {} nodes ({down} down), {:.2} GB of {:.2} GB used, {} pages; hit ratio {} \
         ({} hits, {} misses since the nodes started)",
        membership.nodes().count(),
        gb(total.bytes),
        gb(total.capacity_bytes),
        total.pages,
        if lookups == 0 {
            "-".to_string()
        } else {
            format!("{:.1}%", 100.0 * total.hits as f64 / lookups as f64)
        },
        total.hits,
        total.misses
    );
    println!(
        "read bandwidth over the last {:.1} s: {:.1} MB/s from the caches, {:.1} MB/s from the \
         under storage ({:.1} MB/s per node)",
        interval.as_secs_f64(),
        cache_rate / 1e6,
        ufs_rate / 1e6,
        (cache_rate + ufs_rate) / 1e6 / membership.nodes().count().max(1) as f64
    );
    // The third number: how soon the last preload job had data in the cache.
    if let Ok(jobs) = client.jobs().await {
        if let Some(j) = jobs.first() {
            println!(
                "last preload job {} ({}): first page cached {} after submission, {} of {} files",
                j.id,
                j.state,
                j.first_page_secs
                    .map_or("-".into(), |s| format!("{s:.3} s")),
                j.files_done,
                j.files_total
            );
        }
    }
    if down > 0 {
        return Err(format!(
            "{down} node(s) did not answer: check that pagestored runs there and that UDP to its \
             ports is open"
        ));
    }
    Ok(())
}

async fn free(client: &Arc<Client>, path: &str) -> Result<(), String> {
    let files = pagestore_tools::load::walk(client, path).await?;
    let mut pages = 0;
    for f in &files {
        let info = client.stat(f).await.map_err(|e| format!("{f}: {e}"))?;
        pages += client
            .invalidate_checked(f, Some(info.file_id))
            .await
            .map_err(|e| format!("{f}: {e}"))?;
    }
    println!(
        "freed {pages} cached pages of {} files under {path}",
        files.len()
    );
    Ok(())
}

/// The commands that work on the cluster's records in etcd (no node needs to run).
async fn etcd_command(
    cluster: &str,
    options: &pagestore_client::etcd::EtcdOptions,
    command: &str,
    rest: &[String],
) -> Result<(), String> {
    use pagestore_client::etcd::{self, Etcd};
    use pagestore_protocol::node_id::{format_uuid, parse_uuid};
    if !etcd::is_etcd_url(cluster) {
        return Err(format!(
            "pagectl {command} works on membership in etcd: give --cluster etcd://HOST:PORT[/CLUSTER]"
        ));
    }
    if command == "mount" && rest.first().is_some_and(|w| w == "set") {
        if let Some(url) = rest.get(2) {
            // Refused before etcd is even asked.
            etcd::no_credentials(url)?;
        }
    }
    let etcd = Etcd::new(cluster, options).map_err(|e| e.to_string())?;
    let state = etcd.state().await.map_err(|e| e.to_string())?;
    let words: Vec<&str> = rest.iter().map(String::as_str).collect();
    match (command, words.as_slice()) {
        ("members", []) => {
            println!(
                "ring mode {} (etcd revision {})",
                state.mode().as_str(),
                state.revision
            );
            println!(
                "{:<38} {:<22} {:>6} {:<6} {:<4} admin",
                "node", "address", "shards", "live", "slot"
            );
            let mut ids: Vec<u128> = state
                .live
                .keys()
                .chain(state.slots.keys())
                .copied()
                .collect();
            ids.sort_unstable();
            ids.dedup();
            for id in ids {
                let r = state.live.get(&id).or(state.slots.get(&id));
                let Some(r) = r else { continue };
                println!(
                    "{:<38} {:<22} {:>6} {:<6} {:<4} {}",
                    format_uuid(id),
                    r.info.addr,
                    r.info.shards,
                    if state.live.contains_key(&id) {
                        "yes"
                    } else {
                        "NO"
                    },
                    if state.slots.contains_key(&id) {
                        "yes"
                    } else {
                        "no"
                    },
                    r.admin.as_deref().unwrap_or("-")
                );
            }
            Ok(())
        }
        ("node", ["remove", id]) => {
            let uuid = parse_uuid(id).ok_or_else(|| format!("{id:?} is not a node UUID"))?;
            if state.live.contains_key(&uuid) {
                return Err(format!(
                    "{id} is live: stop it first (SIGTERM), then remove its slot"
                ));
            }
            if !etcd.remove_slot(uuid).await.map_err(|e| e.to_string())? {
                return Err(format!("{id} has no ring slot (see pagectl members)"));
            }
            println!("removed the ring slot of {}", format_uuid(uuid));
            Ok(())
        }
        ("mount", ["ls"]) | ("mount", []) => {
            for (prefix, url) in &state.mounts {
                let warn = if etcd::credentials_in(url).is_empty() {
                    ""
                } else {
                    "  (credentials stored in etcd: set it again without them)"
                };
                println!("{prefix} <- {}{warn}", pagestore_client::ufs::redact(url));
            }
            Ok(())
        }
        ("mount", ["set", prefix, url]) => {
            // Check the spec the way the nodes parse it (whether the store opens is for each
            // node to say: a file:// path may exist there and not here).
            let (p, u) = pagestore_client::ufs::parse_mount(&format!("{prefix}={url}"))
                .map_err(|e| e.to_string())?;
            etcd.set_mount(&p, &u).await.map_err(|e| e.to_string())?;
            println!("mount {p} <- {}", pagestore_client::ufs::redact(&u));
            Ok(())
        }
        ("mount", ["rm", prefix]) => {
            if !etcd.remove_mount(prefix).await.map_err(|e| e.to_string())? {
                return Err(format!("no mount at {prefix} (see pagectl mount ls)"));
            }
            println!("removed mount {prefix}");
            Ok(())
        }
        _ => Err(format!(
            "bad command: {command} {}

{USAGE}",
            words.join(" ")
        )),
    }
}

fn ring(client: &Client) -> Result<(), String> {
    let membership = client.membership();
    let down = client.down_members();
    let shares = membership.ring().shares();
    let mut by_node: std::collections::BTreeMap<u128, f64> = std::collections::BTreeMap::new();
    for (m, share) in &shares {
        *by_node.entry(m.node).or_default() += share;
    }
    println!("ring epoch {}", membership.ring().epoch());
    println!("{:<38} {:>6} {:>8}", "node / shard", "", "share");
    for n in membership.nodes() {
        println!(
            "{:<38} {:>6} {:>7.2}%{}",
            pagestore_protocol::node_id::format_uuid(n.id),
            format!("{} sh.", n.shards),
            100.0 * by_node.get(&n.id).copied().unwrap_or(0.0),
            if down.contains(&n.id) {
                "  DOWN (its keys are read from the under storage)"
            } else {
                ""
            }
        );
        for (m, share) in shares.iter().filter(|(m, _)| m.node == n.id) {
            println!("  shard {:<30} {:>6} {:>7.2}%", m.shard, "", 100.0 * share);
        }
    }
    Ok(())
}

async fn head(client: &Arc<Client>, path: &str, lines: usize) -> Result<(), String> {
    let mut f = client.open(path).await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut seen = 0;
    'read: while seen < lines {
        let n = f.read(&mut buf).await.map_err(|e| format!("{path}: {e}"))?;
        if n == 0 {
            break;
        }
        for (i, b) in buf[..n].iter().enumerate() {
            if *b == b'\n' {
                seen += 1;
                if seen == lines {
                    out.extend_from_slice(&buf[..=i]);
                    break 'read;
                }
            }
        }
        out.extend_from_slice(&buf[..n]);
    }
    let _ = std::io::stdout().write_all(&out);
    Ok(())
}

async fn stat(client: &Client, path: &str) -> Result<(), String> {
    match client.stat_path(path).await.map_err(|e| e.to_string())? {
        PathKind::Dir => println!("{path}: directory"),
        PathKind::File {
            size,
            version_tag,
            file_id,
        } => println!(
            "{path}: file\n  size     {size}\n  version  {version_tag}\n  file id  {:032x}\n  pages    {}",
            file_id.as_u128(),
            size.div_ceil(u64::from(client.page_size()))
        ),
    }
    Ok(())
}
