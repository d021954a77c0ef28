//! `pagectl`: the pagestore command line: read files and list directories through the
//! cluster, and manage cluster certificates.

use std::{io::Write, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use clap::{Parser, Subcommand};
use pagestore_cli::{init_logging, ClusterArgs};
use pagestore_client::{Client, Error};
use pagestore_protocol::{
    frame::{FileState, PathKind},
    tls::{ClusterCa, Role},
};
use tokio::io::AsyncReadExt;

/// The pagestore command line: read files and list directories through the cluster, preload and
/// drop cached files, show the cluster's state, manage its certificates, and (with etcd) its
/// membership and mounts.
///
/// Options may come before or after the command word (pagectl --cluster X ls /data, pagectl ls
/// -l /data --cluster X). `pagectl help COMMAND` describes one command.
#[derive(Parser, Debug)]
// An option given twice takes its last value, as before clap.
#[command(name = "pagectl", args_override_self = true)]
struct Cli {
    #[command(flatten)]
    cluster: ClusterArgs,

    /// Accepted and ignored (older scripts pass it).
    #[arg(long, global = true, hide = true)]
    wait: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug, PartialEq)]
enum Command {
    /// Write files to standard output
    Cat {
        /// Files in the namespace (e.g. /data/a.bin)
        #[arg(value_name = "PATH", required = true)]
        paths: Vec<String>,
    },

    /// List a directory (or show one file)
    Ls {
        /// Sizes too
        #[arg(short = 'l')]
        long: bool,
        /// A directory or a file
        #[arg(value_name = "PATH", default_value = "/")]
        path: String,
    },

    /// Without PATH: the cluster; with PATH: size, version, file id and pages of a path
    ///
    /// Without PATH: nodes (DOWN if they do not answer), shards, capacity, use, hit ratio and
    /// read bandwidth from the caches and from the under storage (sampled over --interval) of
    /// the cluster, and the last preload job's time to its first page. With PATH: size,
    /// version, file id and pages of a path.
    Stat {
        /// A file or directory
        #[arg(value_name = "PATH")]
        path: Option<String>,
        /// Seconds over which the read bandwidth is sampled (0 to 3600)
        #[arg(
            long,
            value_name = "SECS",
            default_value = "1",
            allow_negative_numbers = true,
            value_parser = parse_interval
        )]
        interval: Duration,
    },

    /// A live view of the hottest files and pages, each node's and shard's bandwidth
    ///
    /// Refreshes every --interval: each node's and shard's bytes served per second (from memory,
    /// disk and the under storage), hit ratio, share of the cluster's bytes (HOT when one node
    /// serves at least 1.5 times its fair share: where the bandwidth runs out first), memory
    /// tier use; the hottest files and pages; the egress each mount kept off its store.
    /// --json prints one JSON object per view instead.
    Top {
        /// Seconds between views (0.1 to 3600)
        #[arg(
            long,
            value_name = "SECS",
            default_value = "1",
            allow_negative_numbers = true,
            value_parser = parse_interval
        )]
        interval: Duration,
        /// Stop after N views (default: until interrupted; with --json: 1)
        #[arg(long, value_name = "N")]
        count: Option<u64>,
        /// One JSON object per view (for scripts)
        #[arg(long)]
        json: bool,
    },

    /// Each node's and shard's share of the ring
    Ring,

    /// The first lines of a file
    Head {
        /// Lines to show
        #[arg(short = 'n', value_name = "LINES", default_value_t = 10)]
        lines: usize,
        /// A file
        #[arg(value_name = "PATH")]
        path: String,
    },

    /// Preload files into the cache (--manifest FILE | --prefix PATH)
    ///
    /// Preloads files into the cache: a manifest lists one logical path per line (or JSON lines
    /// with a "path" field; FILE may be a local file or a path in the namespace); --prefix takes
    /// every file under a directory. Pages already cached are skipped. --verify also compares
    /// every cached page with the under storage and reloads what differs. Runs until the job is
    /// done; `pagectl jobs` shows it meanwhile.
    Load {
        /// The manifest: a local file or a path in the namespace
        #[arg(long, value_name = "FILE")]
        manifest: Option<String>,
        /// Every file under this directory
        #[arg(long, value_name = "PATH")]
        prefix: Option<String>,
        /// Load requests in flight at once, each naming many files (default 16); with
        /// --verify, files in flight at once
        #[arg(long, value_name = "N")]
        parallel: Option<usize>,
        /// Also compare every cached page with the under storage and reload what differs
        #[arg(long)]
        verify: bool,
    },

    /// Past and running preload jobs (the nodes keep the last 100)
    Jobs,

    /// Drop every cached page of the files under PATH (a directory or a file)
    ///
    /// Drops every cached page of the files under PATH (a directory or a file); the under
    /// storage is not touched. Needs an admin certificate.
    Free {
        /// A directory or a file
        #[arg(value_name = "PATH")]
        path: String,
    },

    /// Write a local file (or - for standard input) to PATH
    ///
    /// Writes a local file (or - for standard input) to PATH. On a write=back or
    /// write=transient mount it goes through the cluster (acknowledged once durable on the
    /// write replicas, flushed later); on a write=through mount to the under storage, with the
    /// store's credentials on this machine.
    Put {
        /// The local file, or - for standard input
        #[arg(value_name = "LOCAL")]
        local: PathBuf,
        /// Where in the namespace
        #[arg(value_name = "PATH")]
        path: String,
    },

    /// Delete a file (write=back and write=transient mounts, or through with credentials)
    Rm {
        /// The file
        #[arg(value_name = "PATH")]
        path: String,
    },

    /// Rename a file within a write=back or write=transient mount
    Mv {
        /// The file
        #[arg(value_name = "FROM")]
        from: String,
        /// Its new path (replaced if it exists)
        #[arg(value_name = "TO")]
        to: String,
    },

    /// Make a directory in a write=back or write=transient mount
    Mkdir {
        /// The directory
        #[arg(value_name = "PATH")]
        path: String,
    },

    /// Remove an empty directory of a write=back or write=transient mount
    Rmdir {
        /// The directory
        #[arg(value_name = "PATH")]
        path: String,
    },

    /// Wait until everything written under PATH is in the under storage
    ///
    /// Waits until every file written through the cluster under PATH (a file or a directory)
    /// is flushed to the under storage, and every deletion applied there, printing progress;
    /// exits 0 then. Exits 1 with the last flush error if nothing flushes for --timeout.
    Sync {
        /// A file or directory
        #[arg(value_name = "PATH", default_value = "/")]
        path: String,
        /// Give up after this many seconds without progress (default 600)
        #[arg(long = "give-up", value_name = "SECS", default_value_t = 600.0)]
        give_up: f64,
    },

    /// (etcd) Live members and ring slots, and the ring mode
    Members,

    /// (etcd) Manage ring slots: node remove UUID
    Node {
        #[command(subcommand)]
        action: NodeCommand,
    },

    /// The mount table: mount ls (any cluster), mount set /PREFIX URL, mount rm /PREFIX (etcd)
    Mount {
        #[command(subcommand)]
        action: Option<MountCommand>,
    },

    /// Create a cluster CA (ca-cert.pem, ca-key.pem) in DIR
    ///
    /// Creates a cluster CA (ca-cert.pem, ca-key.pem) in DIR; copy both files into each node's
    /// TLS directory before its first start to form one cluster.
    CaInit {
        /// Where to write the CA
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },

    /// Client certificates: cert issue --role ROLE [--name NAME] DIR
    Cert {
        #[command(subcommand)]
        action: CertCommand,
    },
}

#[derive(Subcommand, Debug, PartialEq)]
enum NodeCommand {
    /// Remove a member's ring slot: a permanent departure (static ring); stop the node first
    Remove {
        /// The node's id (see pagectl members)
        #[arg(value_name = "UUID")]
        id: String,
    },
}

#[derive(Subcommand, Debug, PartialEq)]
enum MountCommand {
    /// The mount table (also `pagectl mount` alone)
    Ls,

    /// Add or change a mount; nodes apply it within seconds
    ///
    /// Adds or changes a mount; nodes apply it within seconds. The URL holds no credentials
    /// (they would be readable in etcd): nodes add their own, from a --mount of the same prefix
    /// and URL or their environment.
    Set {
        /// The logical prefix (e.g. /data)
        #[arg(value_name = "/PREFIX")]
        prefix: String,
        /// The under storage, without credentials (file:///dir, s3://bucket/prefix?..., gs://...)
        #[arg(value_name = "URL")]
        url: String,
    },

    /// Remove a mount
    Rm {
        /// The logical prefix
        #[arg(value_name = "/PREFIX")]
        prefix: String,
    },
}

#[derive(Subcommand, Debug, PartialEq)]
enum CertCommand {
    /// Issue a client certificate signed by the cluster CA in --tls-dir into DIR
    ///
    /// Issues a client certificate signed by the cluster CA in --tls-dir (which must hold
    /// ca-key.pem) into DIR (client-cert.pem, client-key.pem 0600, and ca-cert.pem): give DIR to
    /// a client as its --tls-dir. See docs/SECURITY.md.
    Issue {
        /// reader (read only), writer (also store pages, invalidate, job records) or admin
        /// (also drop cached files)
        #[arg(long, value_name = "ROLE", value_parser = parse_role)]
        role: Role,
        /// The certificate's name (default "pagestore ROLE")
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
        /// Where to write the certificate (a client's --tls-dir)
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

fn parse_role(s: &str) -> Result<Role, String> {
    Role::parse(s).ok_or_else(|| format!("{s:?}: expected reader, writer, admin or node"))
}

/// `stat --interval SECS`: 0 to an hour.
fn parse_interval(s: &str) -> Result<Duration, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if v.is_nan() {
        return Err("not a number".into());
    }
    Ok(Duration::from_secs_f64(v.clamp(0.0, 3600.0)))
}

fn main() {
    init_logging();
    let cli: Cli = pagestore_cli::parse_or_exit(1);
    if let Err(e) = real_main(cli) {
        eprintln!("pagectl: {}", pagestore_cli::error_chain(&e));
        std::process::exit(1);
    }
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    let Cli {
        cluster, command, ..
    } = cli;
    match command {
        Command::CaInit { dir } => return ca_init(dir),
        Command::Cert {
            action: CertCommand::Issue { role, name, dir },
        } => {
            let name = name.unwrap_or_else(|| format!("pagestore {role}"));
            return cert_issue(&cluster.tls_dir(), dir, role, &name);
        }
        _ => {}
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let listing_mounts = matches!(
        command,
        Command::Mount {
            action: None | Some(MountCommand::Ls)
        }
    );
    if matches!(
        command,
        Command::Members | Command::Node { .. } | Command::Mount { .. }
    ) && (!listing_mounts || pagestore_client::etcd::is_etcd_url(&cluster.cluster()))
    {
        let opts = cluster.etcd_options()?.unwrap_or_default();
        return runtime.block_on(etcd_command(&cluster.cluster(), &opts, &command));
    }
    runtime.block_on(async {
        let client = cluster.connect(None).await?;
        match command {
            Command::Cat { paths } => {
                for p in &paths {
                    cat(&client, p).await?;
                }
                Ok(())
            }
            Command::Ls { long, path } => ls(&client, &path, long).await,
            Command::Stat {
                path: Some(path), ..
            } => stat(&client, &path).await,
            Command::Stat {
                path: None,
                interval,
            } => cluster_stat(&client, interval).await,
            Command::Top {
                interval,
                count,
                json,
            } => {
                let interval = interval.max(Duration::from_millis(100));
                let count = count.or(json.then_some(1));
                pagestore_tools::top::run(&client, interval, count, json).await
            }
            Command::Ring => ring(&client),
            Command::Free { path } => free(&client, &path).await,
            Command::Head { lines, path } => head(&client, &path, lines).await,
            Command::Load {
                manifest,
                prefix,
                parallel,
                verify,
            } => {
                let mut load_opts = pagestore_tools::load::LoadOptions::default();
                if let Some(n) = parallel {
                    load_opts.parallel = n;
                }
                load_opts.verify = verify;
                load(&client, manifest, prefix, &load_opts).await
            }
            Command::Jobs => jobs(&client).await,
            Command::Put { local, path } => put(&client, &local, &path).await,
            Command::Rm { path } => Ok(client.delete(&path).await?),
            Command::Mv { from, to } => Ok(client.rename(&from, &to, true).await?),
            Command::Mkdir { path } => Ok(client.make_dir(&path).await?),
            Command::Rmdir { path } => Ok(client.remove_dir(&path).await?),
            Command::Sync { path, give_up } => {
                sync(&client, &path, Duration::from_secs_f64(give_up.max(0.0))).await
            }
            Command::Mount { .. } => {
                mount_ls(&client);
                Ok(())
            }
            Command::Members
            | Command::Node { .. }
            | Command::CaInit { .. }
            | Command::Cert { .. } => Ok(()),
        }
    })
}

fn ca_init(dir: PathBuf) -> anyhow::Result<()> {
    let (cert, key) = (dir.join("ca-cert.pem"), dir.join("ca-key.pem"));
    if cert.exists() || key.exists() {
        anyhow::bail!(
            "{} already holds a CA; remove it first if you really want a new one",
            dir.display()
        );
    }
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let ca = ClusterCa::generate(pagestore_protocol::tls::CA_NAME)?;
    ca.save(&cert, &key)?;
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
) -> anyhow::Result<()> {
    let (ca_cert, ca_key) = (tls_dir.join("ca-cert.pem"), tls_dir.join("ca-key.pem"));
    if !ca_key.exists() {
        anyhow::bail!(
            "{} does not exist: run this where the cluster CA's key is (a node's TLS directory, \
             or the directory given to pagectl ca-init), with --tls-dir pointing at it",
            ca_key.display()
        );
    }
    let ca = ClusterCa::load(&ca_cert, &ca_key)?;
    let (cert, key) = (dir.join("client-cert.pem"), dir.join("client-key.pem"));
    if cert.exists() || key.exists() {
        anyhow::bail!(
            "{} already holds a client certificate; remove it first",
            dir.display()
        );
    }
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let id = ca.issue(name, role)?;
    pagestore_protocol::tls::save_identity(&id, &cert, &key)?;
    let ca_copy = dir.join("ca-cert.pem");
    if ca_copy != ca_cert {
        std::fs::copy(&ca_cert, &ca_copy).with_context(|| ca_copy.display().to_string())?;
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

async fn cat(client: &Arc<Client>, path: &str) -> anyhow::Result<()> {
    let mut f = client.open(path).await?;
    let mut buf = vec![0u8; client.page_size() as usize];
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    loop {
        let n = f.read(&mut buf).await.with_context(|| path.to_string())?;
        if n == 0 {
            break;
        }
        match out.write_all(&buf[..n]) {
            Ok(()) => {}
            // `pagectl cat f | head` is not an error.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => anyhow::bail!("writing standard output: {e}"),
        }
    }
    match out.flush() {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("writing standard output"))
        }
        _ => Ok(()),
    }
}

async fn ls(client: &Client, path: &str, long: bool) -> anyhow::Result<()> {
    let entries = match client.list(path).await {
        Ok(e) => e,
        Err(Error::NotDir(_)) => {
            let info = client.stat(path).await?;
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
        Err(e) => return Err(e.into()),
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
) -> anyhow::Result<()> {
    use pagestore_tools::load;
    let mut opts = opts.clone();
    opts.submitted = load::unix_now();
    opts.source = match (&manifest, &prefix) {
        (Some(m), _) => format!("manifest {m}"),
        (_, Some(p)) => format!("prefix {p}"),
        _ => String::new(),
    };
    let opts = &opts;
    let paths = match (manifest, prefix) {
        (Some(m), None) => {
            let text = if std::path::Path::new(&m).exists() || !m.starts_with('/') {
                std::fs::read_to_string(&m).with_context(|| format!("manifest {m}"))?
            } else {
                let b = client
                    .read(&m, 0..u64::MAX)
                    .await
                    .with_context(|| format!("manifest {m}"))?;
                String::from_utf8(b.to_vec())
                    .map_err(|_| anyhow::anyhow!("manifest {m}: not UTF-8"))?
            };
            let paths = load::parse_manifest(&text)?;
            eprintln!(
                "job {}: {} files (their directories are listed as they load); see pagectl jobs",
                opts.id,
                paths.len()
            );
            load::JobFiles::Manifest(paths)
        }
        (None, Some(p)) => {
            let files = load::prefix_files(client, &p).await?;
            eprintln!(
                "job {}: the files under {p} (listed as they load); see pagectl jobs",
                opts.id
            );
            files
        }
        _ => anyhow::bail!("load needs exactly one of --manifest FILE or --prefix PATH"),
    };
    let r = load::run_job(client.clone(), paths, opts).await;
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
            .map_or("-".into(), |s| format!("{s:.3} s")),
        r.total_secs,
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
        anyhow::bail!("{} files failed", r.failed);
    }
    Ok(())
}

/// Past and running preload jobs, as the nodes keep their records.
async fn jobs(client: &Client) -> anyhow::Result<()> {
    let records = client.jobs().await?;
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
                e.0 += c.hit_bytes + c.memory_hit_bytes;
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

async fn cluster_stat(client: &Client, interval: std::time::Duration) -> anyhow::Result<()> {
    let before = pagestore_tools::top::Sample::take(client).await;
    let rates = node_rates(client, interval).await;
    let after = pagestore_tools::top::Sample::take(client).await;
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
        let (mut c, answered) = sum_shards(
            stats
                .iter()
                .filter(|(m, _, _)| m.id == n.id)
                .filter_map(|(_, _, s)| s.as_ref()),
        );
        // Reads the memory tier answered are hits the engine never saw.
        c.hits += after.memory_hits(n.id);
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
            hit_ratio(c.hits, c.misses),
            cr / 1e6,
            ur / 1e6
        );
        add_stat(&mut total, &c);
    }
    println!(
        "cluster: {} nodes ({down} down), {:.2} GB of {:.2} GB used, {} pages; hit ratio {} \
         ({} hits, {} misses since the nodes started)",
        membership.nodes().count(),
        gb(total.bytes),
        gb(total.capacity_bytes),
        total.pages,
        hit_ratio(total.hits, total.misses),
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
    let mounts = pagestore_tools::top::egress(&before, &after);
    print!(
        "{}",
        pagestore_tools::top::egress_lines(&mounts, after.secs_since(&before))
    );
    print_last_job(client).await;
    if down > 0 {
        anyhow::bail!(
            "{down} node(s) did not answer: check that pagestored runs there and that UDP to its \
             ports is open"
        );
    }
    Ok(())
}

/// The sum of the shards' counters that answered, and how many did.
fn sum_shards<'a>(
    shards: impl Iterator<Item = &'a pagestore_client::ShardStat>,
) -> (pagestore_client::ShardStat, usize) {
    let mut c = pagestore_client::ShardStat::default();
    let mut answered = 0;
    for s in shards {
        answered += 1;
        add_stat(&mut c, s);
    }
    (c, answered)
}

fn add_stat(total: &mut pagestore_client::ShardStat, c: &pagestore_client::ShardStat) {
    total.pages += c.pages;
    total.bytes += c.bytes;
    total.capacity_bytes += c.capacity_bytes;
    total.hits += c.hits;
    total.misses += c.misses;
}

/// `12.3%`, or `-` before the first lookup.
fn hit_ratio(hits: u64, misses: u64) -> String {
    let lookups = hits + misses;
    if lookups == 0 {
        "-".to_string()
    } else {
        format!("{:.1}%", 100.0 * hits as f64 / lookups as f64)
    }
}

/// The third number: how soon the last preload job had data in the cache.
async fn print_last_job(client: &Client) {
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
}

async fn free(client: &Arc<Client>, path: &str) -> anyhow::Result<()> {
    use futures_util::{StreamExt, TryStreamExt};
    let files = pagestore_tools::load::walk(client, path).await?;
    // Each file asks every shard: 16 files at a time, not one (a directory of 100,000 files
    // took 20 s one by one); the first error ends the command, naming its file.
    let pages: u64 = futures_util::stream::iter(&files)
        .map(|f| async move {
            let info = match &f.listed {
                Some(info) => info.clone(),
                None => client.stat(&f.path).await.with_context(|| f.path.clone())?,
            };
            client
                .invalidate_checked(&f.path, Some(info.file_id))
                .await
                .with_context(|| f.path.clone())
        })
        .buffer_unordered(16)
        .try_fold(0, |sum, n| async move { Ok(sum + n) })
        .await?;
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
    command: &Command,
) -> anyhow::Result<()> {
    use pagestore_client::etcd::{self, Etcd};
    if !etcd::is_etcd_url(cluster) {
        let command = match command {
            Command::Members => "members",
            Command::Node { .. } => "node",
            _ => "mount",
        };
        anyhow::bail!(
            "pagectl {command} works on membership in etcd: give --cluster etcd://HOST:PORT[/CLUSTER]"
        );
    }
    if let Command::Mount {
        action: Some(MountCommand::Set { url, .. }),
    } = command
    {
        // Refused before etcd is even asked.
        etcd::no_credentials(url)?;
    }
    let etcd = Etcd::new(cluster, options)?;
    let state = etcd.state().await?;
    match command {
        Command::Members => {
            print_members(&state);
            Ok(())
        }
        Command::Node {
            action: NodeCommand::Remove { id },
        } => remove_node_slot(&etcd, &state, id).await,
        Command::Mount {
            action: None | Some(MountCommand::Ls),
        } => {
            for (prefix, url) in &state.mounts {
                let warn = if etcd::credentials_in(url).is_empty() {
                    ""
                } else {
                    "  (credentials stored in etcd: set it again without them)"
                };
                println!(
                    "{prefix} <- {}  write={}{warn}",
                    pagestore_client::ufs::redact(url),
                    policy_of(url)
                );
            }
            Ok(())
        }
        Command::Mount {
            action: Some(MountCommand::Set { prefix, url }),
        } => {
            // Check the spec the way the nodes parse it (whether the store opens is for each
            // node to say: a file:// path may exist there and not here).
            let (p, u) = pagestore_client::ufs::parse_mount(&format!("{prefix}={url}"))?;
            etcd.set_mount(&p, &u).await?;
            println!("mount {p} <- {}", pagestore_client::ufs::redact(&u));
            Ok(())
        }
        Command::Mount {
            action: Some(MountCommand::Rm { prefix }),
        } => {
            if !etcd.remove_mount(prefix).await? {
                anyhow::bail!("no mount at {prefix} (see pagectl mount ls)");
            }
            println!("removed mount {prefix}");
            Ok(())
        }
        other => Err(anyhow::anyhow!("{other:?} is not a command on etcd")),
    }
}

/// `pagectl members`: the ring mode, then every node that is live or holds a slot.
fn print_members(state: &pagestore_client::etcd::ClusterState) {
    use pagestore_protocol::node_id::format_uuid;
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
}

/// `pagectl node remove ID`: refused while the node is live.
async fn remove_node_slot(
    etcd: &pagestore_client::etcd::Etcd,
    state: &pagestore_client::etcd::ClusterState,
    id: &str,
) -> anyhow::Result<()> {
    use pagestore_protocol::node_id::{format_uuid, parse_uuid};
    let uuid = parse_uuid(id).with_context(|| format!("{id:?} is not a node UUID"))?;
    if state.live.contains_key(&uuid) {
        anyhow::bail!("{id} is live: stop it first (SIGTERM), then remove its slot");
    }
    if !etcd.remove_slot(uuid).await? {
        anyhow::bail!("{id} has no ring slot (see pagectl members)");
    }
    println!("removed the ring slot of {}", format_uuid(uuid));
    Ok(())
}

fn ring(client: &Client) -> anyhow::Result<()> {
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

async fn head(client: &Arc<Client>, path: &str, lines: usize) -> anyhow::Result<()> {
    let mut f = client.open(path).await?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut seen = 0;
    'read: while seen < lines {
        let n = f.read(&mut buf).await.with_context(|| path.to_string())?;
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

/// A time in nanoseconds since the Unix epoch as `pagectl stat` prints it.
fn unix_time(ns: i64) -> String {
    format!(
        "{}.{:09} (Unix time)",
        ns.div_euclid(1_000_000_000),
        ns.rem_euclid(1_000_000_000)
    )
}

async fn stat(client: &Client, path: &str) -> anyhow::Result<()> {
    match client.stat_path(path).await? {
        PathKind::Dir { mtime_ns: 0 } => println!("{path}: directory"),
        PathKind::Dir { mtime_ns } => {
            println!("{path}: directory\n  modified {}", unix_time(mtime_ns))
        }
        PathKind::File {
            size,
            version_tag,
            file_id,
            mtime_ns,
            state,
            store_tag,
        } => {
            println!(
                "{path}: file\n  size     {size}\n  version  {version_tag}\n  modified {}\n  \
                 file id  {:032x}\n  pages    {}\n  state    {}",
                unix_time(mtime_ns),
                file_id.as_u128(),
                size.div_ceil(u64::from(client.page_size())),
                describe_state(state)
            );
            if state != FileState::Stored && !store_tag.is_empty() {
                println!("  store    {store_tag}");
            }
            // A file written through the cluster: the object attributes it keeps.
            if state != FileState::Stored {
                if let Ok(attrs) = client.attributes(path, &version_tag).await {
                    for a in attrs {
                        println!("  attr     {}: {}", a.name, a.value);
                    }
                }
            }
            if matches!(state, FileState::Writing | FileState::Dirty) {
                if let Ok(s) = client.write_back_state(path).await {
                    if !s.last_error.is_empty() {
                        println!("  flush    failing: {}", s.last_error);
                    }
                }
            }
        }
    }
    Ok(())
}

/// A mount URL's write policy, for people (an unknown value shown as it is refused).
fn policy_of(url: &str) -> String {
    match pagestore_protocol::writeback::WritePolicy::of_url(url) {
        Ok(p) => p.to_string(),
        Err(e) => format!("? ({e})"),
    }
}

/// `pagectl mount ls` without etcd: the table the cluster serves.
fn mount_ls(client: &Client) {
    for m in client.mounts() {
        let prefix = if m.prefix.is_empty() { "/" } else { &m.prefix };
        println!("{prefix} <- {}  write={}", m.url, policy_of(&m.url));
    }
}

/// `pagectl put LOCAL PATH`.
async fn put(client: &Arc<Client>, local: &std::path::Path, path: &str) -> anyhow::Result<()> {
    let data = if local == std::path::Path::new("-") {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut v)?;
        v
    } else {
        std::fs::read(local).with_context(|| local.display().to_string())?
    };
    let info = client.put(path, data.into()).await?;
    println!(
        "{path}: {} bytes, version {} ({})",
        info.size,
        info.version,
        describe_state(info.state)
    );
    Ok(())
}

/// `pagectl sync PATH`: waits until nothing under PATH waits for the under storage.
async fn sync(client: &Client, path: &str, give_up: Duration) -> anyhow::Result<()> {
    let mut last_change = std::time::Instant::now();
    let mut last: Option<(u64, u64)> = None;
    loop {
        let s = client.write_back_state(path).await?;
        let now = (s.files_dirty, s.deletes_pending);
        if now == (0, 0) {
            println!("{path}: everything written is in the under storage");
            return Ok(());
        }
        if last != Some(now) {
            println!(
                "{path}: {} file(s), {} bytes waiting; {} deletion(s) pending; oldest change                  {:.1} s ago",
                s.files_dirty,
                s.bytes_dirty,
                s.deletes_pending,
                s.oldest_dirty_ms as f64 / 1e3
            );
            last = Some(now);
            last_change = std::time::Instant::now();
        } else if last_change.elapsed() >= give_up {
            let why = if s.last_error.is_empty() {
                "no flush progress".to_string()
            } else {
                s.last_error
            };
            anyhow::bail!(
                "{path}: still {} file(s) not flushed after {give_up:?}: {why}",
                s.files_dirty
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What a file's state means, for people.
fn describe_state(state: FileState) -> &'static str {
    match state {
        FileState::Stored => "in the under storage",
        FileState::Writing => "written through the cluster, open by its writer, not flushed",
        FileState::Dirty => "written through the cluster, waiting to be flushed",
        FileState::Clean => "written through the cluster and flushed to the under storage",
        FileState::Transient => "kept on the cluster only (transient mount, never flushed)",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn parse(line: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("pagectl").chain(line.split_whitespace()))
    }

    #[test]
    fn options_go_before_or_after_the_command() {
        for line in [
            "--cluster 10.0.0.1:7400 --tls-dir /t ls -l /data",
            "ls -l /data --cluster 10.0.0.1:7400 --tls-dir /t",
            "ls --cluster=10.0.0.1:7400 -l --tls-dir=/t /data",
            "--wait --tls-dir /t ls /data -l --cluster 10.0.0.1:7400 --wait",
        ] {
            let c = parse(line).unwrap();
            assert_eq!(c.cluster.cluster(), "10.0.0.1:7400", "{line}");
            assert_eq!(c.cluster.tls_dir(), PathBuf::from("/t"), "{line}");
            assert_eq!(
                c.command,
                Command::Ls {
                    long: true,
                    path: "/data".into()
                },
                "{line}"
            );
        }
        // Given twice, the last one counts (the tests' helper puts its own first).
        for line in [
            "--tls-dir /a --cluster 1.1.1.1:1 --tls-dir /t cat /f --cluster 10.0.0.1:7400",
            "--tls-dir /a --cluster 10.0.0.1:7400 cat /f --tls-dir /t",
        ] {
            let c = parse(line).unwrap();
            assert_eq!(c.cluster.cluster(), "10.0.0.1:7400", "{line}");
            assert_eq!(c.cluster.tls_dir(), PathBuf::from("/t"), "{line}");
        }
        let c = parse("head -n 1 -n 3 /f --no-fallback --no-fallback").unwrap();
        assert_eq!(
            c.command,
            Command::Head {
                lines: 3,
                path: "/f".into()
            }
        );
        let c = parse("--no-fallback stat --interval 0.2 --timeout 1").unwrap();
        assert_eq!(
            c.command,
            Command::Stat {
                path: None,
                interval: Duration::from_millis(200)
            }
        );
        let o = c.cluster.client_options().unwrap();
        assert!(!o.fallback);
        assert_eq!(o.call_timeout, Duration::from_secs(1));
    }

    #[test]
    fn every_command_line_form_parses() {
        let cmd = |line: &str| parse(line).unwrap().command;
        assert_eq!(
            cmd("cat /a /b /c"),
            Command::Cat {
                paths: vec!["/a".into(), "/b".into(), "/c".into()]
            }
        );
        assert_eq!(
            cmd("ls"),
            Command::Ls {
                long: false,
                path: "/".into()
            }
        );
        assert_eq!(
            cmd("stat /data/f"),
            Command::Stat {
                path: Some("/data/f".into()),
                interval: Duration::from_secs(1)
            }
        );
        assert_eq!(
            cmd("head -n 2 /f"),
            Command::Head {
                lines: 2,
                path: "/f".into()
            }
        );
        assert_eq!(
            cmd("head /f"),
            Command::Head {
                lines: 10,
                path: "/f".into()
            }
        );
        assert_eq!(
            cmd("load --manifest m.txt --parallel 4 --verify"),
            Command::Load {
                manifest: Some("m.txt".into()),
                prefix: None,
                parallel: Some(4),
                verify: true
            }
        );
        assert_eq!(
            cmd("load --prefix /data/set"),
            Command::Load {
                manifest: None,
                prefix: Some("/data/set".into()),
                parallel: None,
                verify: false
            }
        );
        assert_eq!(cmd("ring"), Command::Ring);
        assert_eq!(
            cmd("top"),
            Command::Top {
                interval: Duration::from_secs(1),
                count: None,
                json: false
            }
        );
        assert_eq!(
            cmd("top --interval 0.5 --count 3 --json"),
            Command::Top {
                interval: Duration::from_millis(500),
                count: Some(3),
                json: true
            }
        );
        assert_eq!(cmd("jobs"), Command::Jobs);
        assert_eq!(cmd("members"), Command::Members);
        assert_eq!(
            cmd("free /data"),
            Command::Free {
                path: "/data".into()
            }
        );
        assert_eq!(
            cmd("node remove 0123"),
            Command::Node {
                action: NodeCommand::Remove { id: "0123".into() }
            }
        );
        assert_eq!(cmd("mount"), Command::Mount { action: None });
        assert_eq!(
            cmd("mount ls"),
            Command::Mount {
                action: Some(MountCommand::Ls)
            }
        );
        assert_eq!(
            cmd("mount set /more file:///m"),
            Command::Mount {
                action: Some(MountCommand::Set {
                    prefix: "/more".into(),
                    url: "file:///m".into()
                })
            }
        );
        assert_eq!(
            cmd("mount rm /more"),
            Command::Mount {
                action: Some(MountCommand::Rm {
                    prefix: "/more".into()
                })
            }
        );
        assert_eq!(
            cmd("ca-init /etc/ca"),
            Command::CaInit {
                dir: "/etc/ca".into()
            }
        );
        assert_eq!(
            cmd("cert issue --role reader --name n /r"),
            Command::Cert {
                action: CertCommand::Issue {
                    role: Role::Reader,
                    name: Some("n".into()),
                    dir: "/r".into()
                }
            }
        );
        assert_eq!(
            cmd("--tls-dir /ca cert issue /w --role writer"),
            Command::Cert {
                action: CertCommand::Issue {
                    role: Role::Writer,
                    name: None,
                    dir: "/w".into()
                }
            }
        );
    }

    #[test]
    fn bad_command_lines_say_what_is_wrong() {
        for (line, needle) in [
            ("", "Usage"),
            ("cat", "PATH"),
            ("ls /a /b", "/b"),
            ("frobnicate", "frobnicate"),
            ("ls --frobnicate", "--frobnicate"),
            ("cert issue /r", "--role"),
            (
                "cert issue --role root /r",
                "expected reader, writer, admin or node",
            ),
            ("head -n many /f", "-n"),
            ("stat --interval soon", "--interval"),
            ("node forget 0123", "forget"),
            ("ca-init", "DIR"),
        ] {
            let e = parse(line).unwrap_err().to_string();
            assert!(e.contains(needle), "{line:?}: {e}");
        }
        // --help is not an error.
        for line in ["--help", "help", "ls --help", "help cert issue"] {
            assert!(!parse(line).unwrap_err().use_stderr(), "{line}");
        }
    }
}
