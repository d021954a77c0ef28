//! `pages3`: an S3-compatible gateway in front of the cluster (see `pagestore_tools::pages3`
//! for the S3 side, `docs/OPERATIONS.md` for its use).

use std::{io::Write, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use pagestore_client::{tls, ufs, Client, ClientOptions, ClusterSource};
use pagestore_tools::{flag, home, http_guard, pages3, Args, DEFAULT_LISTEN};
use tokio::signal::unix::{signal, SignalKind};

const DEFAULT_S3_LISTEN: &str = "127.0.0.1:7480";

const USAGE: &str = "\
usage: pages3 [OPTIONS]

Serves the cluster's namespace over the S3 protocol (path-style requests): the first component
of a path is the bucket, the rest the key (/data/a/b.bin is s3://data/a/b.bin). Prints `ready
http://ADDR` on standard output once listening; stops on SIGINT or SIGTERM.

options:
  --listen IP:PORT        HTTP address (default 127.0.0.1:7480)
  --access-key KEY        the access key clients sign with (default $PAGES3_ACCESS_KEY)
  --secret-key SECRET     its secret key (default $PAGES3_SECRET_KEY)
  --anonymous             also serve unsigned GET and HEAD requests (reads and listings) to
                          anyone who can reach --listen; writes still need a signature
  --region REGION         region reported to clients (default us-east-1)
  --mount /LOGICAL=URL    the under storage, as given to pagestored, with credentials
                          (repeatable): needed for writes (PutObject, multipart uploads,
                          DeleteObject) and for reads when a member is down
  --staging-dir DIR       where parts of multipart uploads wait (default
                          $PAGESTORE_HOME/pages3-staging)
  --cluster WHERE         member file, any member's IP:PORT, or etcd://HOST:PORT[/CLUSTER]
                          (default $PAGESTORE_CLUSTER or 127.0.0.1:7400)
  --tls-dir DIR           directory with the cluster's ca-cert.pem (and client-cert.pem and
                          client-key.pem, or ca-key.pem, if the cluster requires client
                          certificates); default $PAGESTORE_TLS_DIR or $PAGESTORE_HOME/cache/tls
  --no-fallback           fail reads instead of reading the under storage when a member is down
  --timeout SECS          time allowed per request to a member (default 3)
  --allow-sigv2           also accept AWS Signature Version 2 (header or presigned), held to
                          15 minutes of clock skew; refused by default
  --header-timeout SECS   time a client has to send a request's head (default 10)
  --body-timeout SECS     time a request body may make no progress (default 30)
  --max-connections N     connections open at once (default 1024)
  --max-connections-per-ip N
                          connections open at once from one address (default 128; 0: no
                          limit)";

/// Logs to stderr at the level in `PAGESTORE_LOG` (or `RUST_LOG`), default info. s3s reports
/// every client error (a missing key, a bad signature) at ERROR: its own lines appear only at
/// debug and trace; the gateway logs server-side failures itself.
fn init_logging() {
    use tracing::Level;
    use tracing_subscriber::{
        filter::{LevelFilter, Targets},
        layer::SubscriberExt,
        util::SubscriberInitExt,
    };
    let level = std::env::var("PAGESTORE_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .ok()
        .and_then(|v| v.parse::<Level>().ok())
        .unwrap_or(Level::INFO);
    let s3s = if matches!(level, Level::DEBUG | Level::TRACE) {
        LevelFilter::from_level(level)
    } else {
        LevelFilter::OFF
    };
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_target(false)
        .finish()
        .with(Targets::new().with_default(level).with_target("s3s", s3s))
        .try_init();
}

fn main() {
    init_logging();
    let code = match real_main() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("pages3: {e}");
            1
        }
    };
    std::process::exit(code);
}

struct Settings {
    listen: SocketAddr,
    cluster: String,
    tls_dir: PathBuf,
    mounts: Vec<(String, String)>,
    client: ClientOptions,
    gateway: pages3::Options,
    limits: http_guard::Limits,
}

fn parse() -> Result<Option<Settings>, String> {
    let mut args = Args::from_env();
    let mut listen = DEFAULT_S3_LISTEN.to_string();
    let mut cluster = std::env::var("PAGESTORE_CLUSTER").unwrap_or_else(|_| DEFAULT_LISTEN.into());
    let mut tls_dir = std::env::var_os("PAGESTORE_TLS_DIR")
        .map_or_else(|| home().join("cache").join("tls"), PathBuf::from);
    let mut access = std::env::var("PAGES3_ACCESS_KEY").ok();
    let mut secret = std::env::var("PAGES3_SECRET_KEY").ok();
    let mut anonymous = false;
    let mut region = "us-east-1".to_string();
    let mut staging = home().join("pages3-staging");
    let mut mounts = Vec::new();
    let mut client = ClientOptions::default();
    let mut allow_sigv2 = false;
    let mut limits = http_guard::Limits::PAGES3;
    let secs = |arg: &str, v: f64| {
        if v.is_finite() && v > 0.0 && v <= 86_400.0 {
            Ok(Duration::from_secs_f64(v))
        } else {
            Err(format!("{arg} {v}: give seconds between 0 and 86400"))
        }
    };
    while let Some(arg) = args.next() {
        match flag(&arg) {
            "--listen" => listen = args.value(&arg)?,
            "--cluster" => cluster = args.value(&arg)?,
            "--tls-dir" => tls_dir = args.value(&arg)?.into(),
            "--mount" => {
                let spec = args.value(&arg)?;
                mounts.push(ufs::parse_mount(&spec).map_err(|e| e.to_string())?);
            }
            "--access-key" => access = Some(args.value(&arg)?),
            "--secret-key" => secret = Some(args.value(&arg)?),
            "--anonymous" => anonymous = true,
            "--region" => region = args.value(&arg)?,
            "--staging-dir" => staging = args.value(&arg)?.into(),
            "--no-fallback" => client.fallback = false,
            "--allow-sigv2" => allow_sigv2 = true,
            "--header-timeout" => limits.header_timeout = secs(&arg, args.parsed(&arg)?)?,
            "--body-timeout" => limits.body_stall_timeout = secs(&arg, args.parsed(&arg)?)?,
            "--max-connections" => {
                limits.max_connections = args.parsed(&arg)?;
                if limits.max_connections == 0 {
                    return Err("--max-connections 0: give at least 1".into());
                }
            }
            "--max-connections-per-ip" => limits.max_connections_per_ip = args.parsed(&arg)?,
            "--timeout" => {
                client.call_timeout = Duration::from_secs_f64(args.parsed::<f64>(&arg)?.max(0.01))
            }
            "-h" | "--help" | "help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            f => return Err(format!("unknown argument {f:?}\n\n{USAGE}")),
        }
    }
    let listen: SocketAddr = listen
        .parse()
        .map_err(|_| format!("--listen {listen:?} is not IP:PORT (e.g. 127.0.0.1:7480)"))?;
    let credentials = match (
        access.filter(|s| !s.is_empty()),
        secret.filter(|s| !s.is_empty()),
    ) {
        (Some(a), Some(s)) => Some((a, s)),
        (None, None) => None,
        (Some(_), None) => {
            return Err("--access-key without --secret-key (or PAGES3_SECRET_KEY)".into())
        }
        (None, Some(_)) => {
            return Err("--secret-key without --access-key (or PAGES3_ACCESS_KEY)".into())
        }
    };
    if credentials.is_none() && !anonymous {
        return Err(
            "refusing to start without credentials: give --access-key and --secret-key \
             (or set PAGES3_ACCESS_KEY and PAGES3_SECRET_KEY) so that clients must sign their \
             requests, or --anonymous to serve unsigned reads to anyone who can connect"
                .into(),
        );
    }
    if region.is_empty()
        || !region
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        return Err(format!(
            "--region {region:?} is not a region name (e.g. us-east-1)"
        ));
    }
    let writable = !mounts.is_empty();
    Ok(Some(Settings {
        listen,
        cluster,
        tls_dir,
        mounts,
        client,
        gateway: pages3::Options {
            region,
            staging_dir: staging,
            credentials,
            anonymous,
            writable,
            allow_sigv2,
        },
        limits,
    }))
}

fn real_main() -> Result<(), String> {
    let Some(s) = parse()? else {
        return Ok(());
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("pages3")
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(run(s))
}

async fn run(s: Settings) -> Result<(), String> {
    let ufs = if s.mounts.is_empty() {
        None
    } else {
        Some(Arc::new(
            ufs::MountTable::new(&s.mounts).map_err(|e| e.to_string())?,
        ))
    };
    let tls = tls::client_config(&s.tls_dir).map_err(|e| e.to_string())?;
    let client = Client::connect(&ClusterSource::parse(&s.cluster), tls, ufs, s.client)
        .await
        .map_err(|e| e.to_string())?;
    for (prefix, _) in &s.mounts {
        if !client.mounts().iter().any(|m| &m.prefix == prefix) {
            tracing::warn!(
                mount = %prefix,
                "--mount names a prefix the cluster does not mount; writes there are not seen \
                 by readers through the cluster"
            );
        }
    }
    let writable = s.gateway.writable;
    let service = pages3::service(client, s.gateway)?;
    let listener = tokio::net::TcpListener::bind(s.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", s.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot listen on {}: {e}", s.listen))?;
    let mut term =
        signal(SignalKind::terminate()).map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
    let mut int =
        signal(SignalKind::interrupt()).map_err(|e| format!("cannot watch SIGINT: {e}"))?;
    tracing::info!(%addr, writable, "pages3 serving");
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "ready http://{addr}");
        let _ = out.flush();
    }
    pages3::serve(listener, service, s.limits, async {
        let which = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = which, "stopping: finishing requests under way");
    })
    .await;
    Ok(())
}
