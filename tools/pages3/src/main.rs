//! `pages3`: an S3-compatible gateway in front of the cluster (see the `pages3` library
//! for the S3 side, `docs/OPERATIONS.md` for its use).

use std::{io::Write, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::{bail, Context};
use clap::Parser;
use pagestore_cli::{home, http_guard, ClusterArgs};
use pagestore_client::ufs;
use tokio::signal::unix::{signal, SignalKind};

/// An S3 gateway in front of the cluster.
///
/// Serves the cluster's namespace over the S3 protocol (path-style requests): the first component
/// of a path is the bucket, the rest the key (/data/a/b.bin is s3://data/a/b.bin). Prints `ready
/// http://ADDR` on standard output once listening; stops on SIGINT or SIGTERM. With
/// --no-fallback, reads of a member that is down fail.
#[derive(Parser, Debug)]
// An option given twice takes its last value (--mount adds up), as before clap.
#[command(name = "pages3", args_override_self = true)]
struct Cli {
    /// HTTP address
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:7480", value_parser = parse_listen)]
    listen: SocketAddr,

    /// The access key clients sign with
    #[arg(
        long,
        value_name = "KEY",
        env = "PAGES3_ACCESS_KEY",
        hide_env_values = true
    )]
    access_key: Option<String>,

    /// Its secret key
    #[arg(
        long,
        value_name = "SECRET",
        env = "PAGES3_SECRET_KEY",
        hide_env_values = true
    )]
    secret_key: Option<String>,

    /// Also serve unsigned GET and HEAD requests (reads and listings) to anyone who can reach
    /// --listen; writes still need a signature
    #[arg(long)]
    anonymous: bool,

    /// Region reported to clients
    #[arg(long, value_name = "REGION", default_value = "us-east-1")]
    region: String,

    /// The under storage, as given to pagestored, with credentials (repeatable): needed for
    /// writes (PutObject, multipart uploads, DeleteObject) and for reads when a member is down;
    /// with a mount of the root (`--mount /=URL`), CreateBucket makes new buckets
    #[arg(long = "mount", value_name = "/LOGICAL=URL", value_parser = parse_mount)]
    mounts: Vec<(String, String)>,

    /// Where parts of multipart uploads wait (default $PAGESTORE_HOME/pages3-staging)
    #[arg(long, value_name = "DIR")]
    staging_dir: Option<PathBuf>,

    /// Also accept AWS Signature Version 2 (header or presigned), held to 15 minutes of clock
    /// skew; refused by default
    #[arg(long)]
    allow_sigv2: bool,

    /// Time a client has to send a request's head (default 10)
    #[arg(long, value_name = "SECS", allow_negative_numbers = true, value_parser = parse_secs)]
    header_timeout: Option<Duration>,

    /// Time a request body may make no progress (default 30)
    #[arg(long, value_name = "SECS", allow_negative_numbers = true, value_parser = parse_secs)]
    body_timeout: Option<Duration>,

    /// Connections open at once (default 1024)
    #[arg(long, value_name = "N", value_parser = parse_max_connections)]
    max_connections: Option<usize>,

    /// Connections open at once from one address (default 128; 0: no limit)
    #[arg(long, value_name = "N")]
    max_connections_per_ip: Option<usize>,

    #[command(flatten)]
    cluster: ClusterArgs,
}

fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    s.parse()
        .map_err(|_| format!("{s:?} is not IP:PORT (e.g. 127.0.0.1:7480)"))
}

fn parse_mount(s: &str) -> Result<(String, String), String> {
    ufs::parse_mount(s).map_err(|e| e.to_string())
}

/// A timeout: more than 0 and at most a day.
fn parse_secs(s: &str) -> Result<Duration, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && v > 0.0 && v <= 86_400.0 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err("give seconds between 0 and 86400".into())
    }
}

fn parse_max_connections(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>().map_err(|e| format!("{e}"))? {
        0 => Err("give at least 1".into()),
        n => Ok(n),
    }
}

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
    let cli: Cli = pagestore_cli::parse_or_exit(1);
    if let Err(e) = real_main(cli) {
        eprintln!("pages3: {}", pagestore_cli::error_chain(&e));
        std::process::exit(1);
    }
}

/// What the gateway serves, and how, checked.
struct Settings {
    listen: SocketAddr,
    cluster: ClusterArgs,
    mounts: Vec<(String, String)>,
    gateway: pages3::Options,
    limits: http_guard::Limits,
}

fn settings(cli: Cli) -> anyhow::Result<Settings> {
    let credentials = match (
        cli.access_key.filter(|s| !s.is_empty()),
        cli.secret_key.filter(|s| !s.is_empty()),
    ) {
        (Some(a), Some(s)) => Some((a, s)),
        (None, None) => None,
        (Some(_), None) => bail!("--access-key without --secret-key (or PAGES3_SECRET_KEY)"),
        (None, Some(_)) => bail!("--secret-key without --access-key (or PAGES3_ACCESS_KEY)"),
    };
    if credentials.is_none() && !cli.anonymous {
        bail!(
            "refusing to start without credentials: give --access-key and --secret-key \
             (or set PAGES3_ACCESS_KEY and PAGES3_SECRET_KEY) so that clients must sign their \
             requests, or --anonymous to serve unsigned reads to anyone who can connect"
        );
    }
    let region = cli.region;
    if region.is_empty()
        || !region
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        bail!("--region {region:?} is not a region name (e.g. us-east-1)");
    }
    let mut limits = http_guard::Limits::PAGES3;
    if let Some(t) = cli.header_timeout {
        limits.header_timeout = t;
    }
    if let Some(t) = cli.body_timeout {
        limits.body_stall_timeout = t;
    }
    if let Some(n) = cli.max_connections {
        limits.max_connections = n;
    }
    if let Some(n) = cli.max_connections_per_ip {
        limits.max_connections_per_ip = n;
    }
    let writable = !cli.mounts.is_empty();
    Ok(Settings {
        listen: cli.listen,
        cluster: cli.cluster,
        mounts: cli.mounts,
        gateway: pages3::Options {
            region,
            staging_dir: cli
                .staging_dir
                .unwrap_or_else(|| home().join("pages3-staging")),
            credentials,
            anonymous: cli.anonymous,
            writable,
            allow_sigv2: cli.allow_sigv2,
        },
        limits,
    })
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    let s = settings(cli)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("pages3")
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(run(s))
}

async fn run(s: Settings) -> anyhow::Result<()> {
    let ufs = if s.mounts.is_empty() {
        None
    } else {
        Some(Arc::new(ufs::MountTable::new(&s.mounts)?))
    };
    let client = s.cluster.connect(ufs).await?;
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
    let region = s.gateway.region.clone();
    let service = pages3::service(client, s.gateway).map_err(anyhow::Error::msg)?;
    let listener = tokio::net::TcpListener::bind(s.listen)
        .await
        .with_context(|| format!("cannot listen on {}", s.listen))?;
    let addr = listener
        .local_addr()
        .with_context(|| format!("cannot listen on {}", s.listen))?;
    let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    tracing::info!(%addr, writable, "pages3 serving");
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "ready http://{addr}");
        let _ = out.flush();
    }
    pages3::serve(listener, service, region, s.limits, async {
        let which = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = which, "stopping: finishing requests under way");
    })
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn parse(line: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("pages3").chain(line.split_whitespace()))
    }

    fn refusal(line: &str) -> String {
        match parse(line) {
            Err(e) => e.to_string(),
            Ok(c) => match settings(c) {
                Err(e) => e.to_string(),
                Ok(_) => panic!("{line}: taken"),
            },
        }
    }

    /// Also the one test that sets the `PAGES3_*` variables.
    #[test]
    fn flags_and_variables_become_settings() {
        std::env::remove_var("PAGES3_ACCESS_KEY");
        std::env::remove_var("PAGES3_SECRET_KEY");
        let c = parse(
            "--listen 127.0.0.1:0 --access-key k --secret-key s --region eu-1 --mount /a=file:///x \
             --mount /b=file:///y --staging-dir /st --allow-sigv2 --header-timeout 1 \
             --body-timeout 2 --max-connections 3 --max-connections-per-ip 0 --cluster /m \
             --tls-dir /t --no-fallback --timeout 4",
        )
        .unwrap();
        let s = settings(c).unwrap();
        assert_eq!(s.listen, "127.0.0.1:0".parse::<SocketAddr>().unwrap());
        assert_eq!(s.mounts.len(), 2);
        assert_eq!(s.mounts[1].0, "/b");
        assert_eq!(
            s.gateway.credentials,
            Some(("k".to_string(), "s".to_string()))
        );
        assert_eq!(s.gateway.region, "eu-1");
        assert_eq!(s.gateway.staging_dir, PathBuf::from("/st"));
        assert!(s.gateway.writable && s.gateway.allow_sigv2 && !s.gateway.anonymous);
        assert_eq!(s.limits.header_timeout, Duration::from_secs(1));
        assert_eq!(s.limits.body_stall_timeout, Duration::from_secs(2));
        assert_eq!(s.limits.max_connections, 3);
        assert_eq!(s.limits.max_connections_per_ip, 0);
        assert_eq!(s.cluster.cluster(), "/m");
        let o = s.cluster.client_options().unwrap();
        assert!(!o.fallback);
        assert_eq!(o.call_timeout, Duration::from_secs(4));

        // Given twice, the last value counts; --mount adds up.
        let s = settings(
            parse("--anonymous --region a --region b --mount /a=file:///x --mount /b=file:///y")
                .unwrap(),
        )
        .unwrap();
        assert_eq!((s.gateway.region.as_str(), s.mounts.len()), ("b", 2));

        // Defaults.
        let s = settings(parse("--anonymous").unwrap()).unwrap();
        assert_eq!(s.listen, "127.0.0.1:7480".parse::<SocketAddr>().unwrap());
        assert_eq!(s.gateway.region, "us-east-1");
        assert!(s.gateway.credentials.is_none() && !s.gateway.writable);
        assert_eq!(s.limits.max_connections, 1024);

        // The key pair from the environment; empty values count as none.
        std::env::set_var("PAGES3_ACCESS_KEY", "ek");
        std::env::set_var("PAGES3_SECRET_KEY", "es");
        let s = settings(parse("").unwrap()).unwrap();
        assert_eq!(
            s.gateway.credentials,
            Some(("ek".to_string(), "es".to_string()))
        );
        std::env::set_var("PAGES3_SECRET_KEY", "");
        assert!(refusal("").contains("--access-key without --secret-key"));
        std::env::remove_var("PAGES3_ACCESS_KEY");
        std::env::remove_var("PAGES3_SECRET_KEY");

        for (line, needle) in [
            ("--anonymous --listen nowhere", "is not IP:PORT"),
            ("--anonymous --mount data=file:///x", "must start with /"),
            ("--anonymous --region eu_1", "is not a region name"),
            ("--anonymous --header-timeout 0", "between 0 and 86400"),
            ("--anonymous --body-timeout 1e9", "between 0 and 86400"),
            ("--anonymous --max-connections 0", "give at least 1"),
            ("--anonymous frobnicate", "frobnicate"),
            ("--anonymous --frobnicate", "--frobnicate"),
            ("", "refusing to start without credentials"),
            ("--secret-key s", "--secret-key without --access-key"),
        ] {
            let e = refusal(line);
            assert!(e.contains(needle), "{line}: {e}");
        }
    }
}
