//! What the client binaries' command lines share: the cluster options that `pagectl`, `pagefs`,
//! `pages3` and `pagebench` flatten into their own clap parsers ([`ClusterArgs`]), the one
//! function that turns them into a connected [`Client`] ([`ClusterArgs::connect`]), and how a
//! bad command line ends the process ([`parse_or_exit`]).

use std::{ffi::OsString, path::PathBuf, sync::Arc, time::Duration};

use pagestore_client::{etcd::EtcdOptions, tls, ufs::MountTable, Client, ClientOptions};

/// Why the cluster options could not give a client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// etcd flags with a cluster that is not in etcd.
    #[error(
        "--etcd-user, --etcd-password-file, --etcd-ca, --etcd-cert and --etcd-key need \
         --cluster etcd://... (or etcds://)"
    )]
    EtcdFlagsWithoutEtcd,
    /// The etcd settings (a `PAGESTORE_ETCD_*` variable, the password file) are unusable.
    #[error("{0}")]
    Etcd(String),
    /// The TLS directory, or starting the client.
    #[error(transparent)]
    Client(#[from] pagestore_client::Error),
}

/// How a client finds and talks to the cluster: `--cluster`, `--tls-dir`, `--timeout`,
/// `--no-fallback` and the etcd client flags. Every option is global: it may come before or
/// after a command word.
#[derive(clap::Args, Clone, Debug, Default, PartialEq)]
#[command(next_help_heading = "Cluster options")]
pub struct ClusterArgs {
    /// A member file, any member's IP:PORT, or etcd://HOST:PORT[/CLUSTER] (etcds:// for TLS);
    /// default $PAGESTORE_CLUSTER or 127.0.0.1:7400. Readers need no etcd: a member's address
    /// follows membership too
    #[arg(long, value_name = "WHERE", global = true)]
    pub cluster: Option<String>,

    /// Directory with the cluster's ca-cert.pem (and client-cert.pem and client-key.pem, or
    /// ca-key.pem, if the cluster requires client certificates); default $PAGESTORE_TLS_DIR or
    /// $PAGESTORE_HOME/cache/tls
    #[arg(long, value_name = "DIR", global = true)]
    pub tls_dir: Option<PathBuf>,

    /// Time allowed per request to a member (default 3)
    #[arg(
        long,
        value_name = "SECS",
        global = true,
        allow_negative_numbers = true,
        value_parser = parse_timeout
    )]
    pub timeout: Option<Duration>,

    /// Fail instead of reading the under storage when a member is down
    #[arg(long, global = true)]
    pub no_fallback: bool,

    /// Log in to etcd as USER (or $PAGESTORE_ETCD_USER); the password comes from
    /// --etcd-password-file or $PAGESTORE_ETCD_PASSWORD
    #[arg(long, value_name = "USER", global = true)]
    pub etcd_user: Option<String>,

    /// File holding the etcd password (first line)
    #[arg(long, value_name = "FILE", global = true)]
    pub etcd_password_file: Option<String>,

    /// With etcds://: CA certificate(s) that sign etcd's certificate (or $PAGESTORE_ETCD_CA)
    #[arg(long, value_name = "FILE", global = true)]
    pub etcd_ca: Option<String>,

    /// With etcds://: client certificate for etcd (or $PAGESTORE_ETCD_CERT)
    #[arg(long, value_name = "FILE", global = true)]
    pub etcd_cert: Option<String>,

    /// With etcds://: its key (or $PAGESTORE_ETCD_KEY)
    #[arg(long, value_name = "FILE", global = true)]
    pub etcd_key: Option<String>,
}

/// `--timeout SECS`: at least 10 ms, at most a million seconds.
fn parse_timeout(s: &str) -> Result<Duration, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if v.is_nan() {
        return Err("not a number".into());
    }
    Ok(Duration::from_secs_f64(v.clamp(0.01, 1e6)))
}

impl ClusterArgs {
    /// `--cluster`, else `$PAGESTORE_CLUSTER`, else [`crate::DEFAULT_LISTEN`].
    pub fn cluster(&self) -> String {
        self.cluster.clone().unwrap_or_else(|| {
            std::env::var("PAGESTORE_CLUSTER").unwrap_or_else(|_| crate::DEFAULT_LISTEN.into())
        })
    }

    /// `--tls-dir`, else `$PAGESTORE_TLS_DIR`, else `$PAGESTORE_HOME/cache/tls`.
    pub fn tls_dir(&self) -> PathBuf {
        self.tls_dir.clone().unwrap_or_else(|| {
            std::env::var_os("PAGESTORE_TLS_DIR")
                .map_or_else(|| crate::home().join("cache").join("tls"), PathBuf::from)
        })
    }

    /// The etcd settings when the cluster is in etcd (flags over `PAGESTORE_ETCD_*`), `None`
    /// otherwise. etcd flags with another kind of cluster are an error.
    pub fn etcd_options(&self) -> Result<Option<EtcdOptions>, Error> {
        let given = [
            &self.etcd_user,
            &self.etcd_password_file,
            &self.etcd_ca,
            &self.etcd_cert,
            &self.etcd_key,
        ];
        if !pagestore_client::etcd::is_etcd_url(&self.cluster()) {
            if given.iter().any(|f| f.is_some()) {
                return Err(Error::EtcdFlagsWithoutEtcd);
            }
            return Ok(None);
        }
        let path = |f: &Option<String>| f.as_ref().map(PathBuf::from);
        EtcdOptions::from_env_and_flags(
            self.etcd_user.clone(),
            path(&self.etcd_password_file).as_deref(),
            [
                path(&self.etcd_ca),
                path(&self.etcd_cert),
                path(&self.etcd_key),
            ],
        )
        .map(Some)
        .map_err(|e| Error::Etcd(e.to_string()))
    }

    /// The client settings these options ask for.
    pub fn client_options(&self) -> Result<ClientOptions, Error> {
        let default = ClientOptions::default();
        Ok(ClientOptions {
            fallback: !self.no_fallback,
            call_timeout: self.timeout.unwrap_or(default.call_timeout),
            etcd: self.etcd_options()?,
            ..default
        })
    }

    /// A client of the cluster these options name, started (it has read the membership);
    /// `ufs` is the under storage it may read and write itself (otherwise the cluster's own
    /// mounts).
    pub async fn connect(&self, ufs: Option<Arc<MountTable>>) -> Result<Arc<Client>, Error> {
        self.connect_with(self.client_options()?, ufs).await
    }

    /// [`ClusterArgs::connect`] with `options` ([`ClusterArgs::client_options`] as the caller
    /// changed them, e.g. the read-ahead of the Python package's `readahead` argument).
    pub async fn connect_with(
        &self,
        options: ClientOptions,
        ufs: Option<Arc<MountTable>>,
    ) -> Result<Arc<Client>, Error> {
        let tls = tls::client_config(&self.tls_dir())?;
        let source = pagestore_client::ClusterSource::parse(&self.cluster());
        Ok(Client::connect(&source, tls, ufs, options).await?)
    }
}

/// Parses the process's command line into `C`. `--help` prints the help on standard output and
/// exits 0; a bad command line prints clap's message (what is wrong, the usage) on standard
/// error and exits with `code`. For the binaries without subcommands, a lone `help` is the help
/// too, as it was before clap.
pub fn parse_or_exit<C: clap::Parser>(code: i32) -> C {
    let args: Vec<OsString> = std::env::args_os().collect();
    let mut cmd = wrap_help(C::command());
    if cmd.get_subcommands().next().is_none() && args.len() == 2 && args[1] == "help" {
        let _ = cmd.print_long_help();
        std::process::exit(0);
    }
    let parsed = cmd
        .try_get_matches_from_mut(args)
        .and_then(|m| C::from_arg_matches(&m).map_err(|e| e.format(&mut cmd)));
    match parsed {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            std::process::exit(if e.use_stderr() { code } else { 0 });
        }
    }
}

/// Width of the help text.
const HELP_WIDTH: usize = 100;

/// Wraps every help text of `cmd` and its subcommands to [`HELP_WIDTH`] columns, with each
/// option's description on the lines under it (clap wraps only with its `wrap_help` feature,
/// which would also ask the terminal for its width).
pub fn wrap_help(cmd: clap::Command) -> clap::Command {
    let mut cmd = cmd.next_line_help(true);
    // A subcommand's about is also listed, indented, in its parent's help.
    if let Some(t) = cmd
        .get_about()
        .map(|t| wrap(&t.to_string(), HELP_WIDTH - 10))
    {
        cmd = cmd.about(t);
    }
    if let Some(t) = cmd
        .get_long_about()
        .map(|t| wrap(&t.to_string(), HELP_WIDTH))
    {
        cmd = cmd.long_about(t);
    }
    if let Some(t) = cmd
        .get_after_help()
        .map(|t| wrap(&t.to_string(), HELP_WIDTH))
    {
        cmd = cmd.after_help(t);
    }
    // Descriptions are indented by 10 columns under their option.
    let width = HELP_WIDTH - 10;
    let ids: Vec<clap::Id> = cmd.get_arguments().map(|a| a.get_id().clone()).collect();
    for id in ids {
        cmd = cmd.mut_arg(id, |mut a| {
            if let Some(t) = a.get_help().map(|t| wrap(&t.to_string(), width)) {
                a = a.help(t);
            }
            if let Some(t) = a.get_long_help().map(|t| wrap(&t.to_string(), width)) {
                a = a.long_help(t);
            }
            a
        });
    }
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    for name in names {
        cmd = cmd.mut_subcommand(name, wrap_help);
    }
    cmd
}

/// `text` with each paragraph (line) broken between words to at most `width` columns.
fn wrap(text: &str, width: usize) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let mut col = 0;
        for word in line.split(' ').filter(|w| !w.is_empty()) {
            let n = word.chars().count();
            if col > 0 && col + 1 + n > width {
                out.push('\n');
                col = 0;
            } else if col > 0 {
                out.push(' ');
                col += 1;
            }
            out.push_str(word);
            col += n;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use clap::Parser;

    use super::*;

    /// A command line with a subcommand, like pagectl's.
    #[derive(Parser, Debug)]
    #[command(args_override_self = true)]
    struct Cli {
        #[command(flatten)]
        cluster: ClusterArgs,
        #[command(subcommand)]
        command: Sub,
    }

    #[derive(clap::Subcommand, Debug, PartialEq)]
    enum Sub {
        Ls {
            #[arg(short = 'l')]
            long: bool,
            path: Option<String>,
        },
    }

    fn parse(line: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("t").chain(line.split_whitespace()))
    }

    #[test]
    fn cluster_options_go_before_or_after_the_command() {
        for line in [
            "--cluster 10.0.0.1:7400 --tls-dir /t --timeout 0.5 --no-fallback ls -l /data",
            "ls -l /data --cluster 10.0.0.1:7400 --tls-dir /t --timeout 0.5 --no-fallback",
            "ls --cluster=10.0.0.1:7400 /data --tls-dir=/t -l --no-fallback --timeout=0.5",
        ] {
            let c = parse(line).unwrap();
            assert_eq!(c.cluster.cluster(), "10.0.0.1:7400", "{line}");
            assert_eq!(c.cluster.tls_dir(), PathBuf::from("/t"), "{line}");
            let o = c.cluster.client_options().unwrap();
            assert!(!o.fallback, "{line}");
            assert_eq!(o.call_timeout, Duration::from_millis(500), "{line}");
            assert!(o.etcd.is_none());
            assert_eq!(
                c.command,
                Sub::Ls {
                    long: true,
                    path: Some("/data".into())
                }
            );
        }
        // Out-of-range timeouts are held to sane bounds rather than panicking.
        let c = parse("--timeout 0 ls").unwrap();
        assert_eq!(c.cluster.timeout, Some(Duration::from_millis(10)));
        let c = parse("--timeout inf ls").unwrap();
        assert_eq!(c.cluster.timeout, Some(Duration::from_secs(1_000_000)));
        for bad in ["soon", "NaN"] {
            let e = parse(&format!("--timeout {bad} ls"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("--timeout"), "{e}");
        }
    }

    /// The variables are the process's own: one test reads them all, in order.
    #[test]
    fn defaults_come_from_the_environment() {
        let keys = ["PAGESTORE_CLUSTER", "PAGESTORE_TLS_DIR", "PAGESTORE_HOME"];
        let saved: Vec<_> = keys.iter().map(std::env::var_os).collect();
        for k in keys {
            std::env::remove_var(k);
        }
        let c = parse("ls").unwrap().cluster;
        assert_eq!(c.cluster(), crate::DEFAULT_LISTEN);
        assert_eq!(
            c.tls_dir(),
            PathBuf::from(crate::DEFAULT_HOME).join("cache/tls")
        );
        let o = c.client_options().unwrap();
        assert!(o.fallback);
        assert_eq!(o.call_timeout, ClientOptions::default().call_timeout);
        std::env::set_var("PAGESTORE_HOME", "/h");
        assert_eq!(c.tls_dir(), PathBuf::from("/h/cache/tls"));
        std::env::set_var("PAGESTORE_CLUSTER", "/etc/members");
        std::env::set_var("PAGESTORE_TLS_DIR", "/tls");
        assert_eq!(c.cluster(), "/etc/members");
        assert_eq!(c.tls_dir(), PathBuf::from("/tls"));
        // A flag wins over its variable.
        let c = parse("ls --cluster 1.2.3.4:5 --tls-dir /mine")
            .unwrap()
            .cluster;
        assert_eq!(c.cluster(), "1.2.3.4:5");
        assert_eq!(c.tls_dir(), PathBuf::from("/mine"));
        for (k, v) in keys.iter().zip(saved) {
            match v {
                Some(v) => std::env::set_var(k, v),
                None => std::env::remove_var(k),
            }
        }
    }

    #[test]
    fn help_is_wrapped() {
        assert_eq!(wrap("a bb ccc dddd", 6), "a bb\nccc\ndddd");
        assert_eq!(wrap("one\n\ntwo  three", 80), "one\n\ntwo three");
        let mut cmd = wrap_help(<Cli as clap::CommandFactory>::command());
        let help = cmd.render_long_help().to_string();
        assert!(
            help.lines().all(|l| l.chars().count() <= HELP_WIDTH),
            "{help}"
        );
        assert!(help.contains("$PAGESTORE_TLS_DIR"), "{help}");
        let ls = cmd
            .find_subcommand_mut("ls")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(ls.contains("--cluster"), "{ls}");
    }

    #[test]
    fn etcd_flags_need_an_etcd_cluster() {
        for flag in [
            "--etcd-user u",
            "--etcd-password-file /p",
            "--etcd-ca /ca",
            "--etcd-cert /c",
            "--etcd-key /k",
        ] {
            let c = parse(&format!("ls --cluster 127.0.0.1:7400 {flag}")).unwrap();
            let e = c.cluster.client_options().unwrap_err();
            assert!(matches!(e, Error::EtcdFlagsWithoutEtcd), "{flag}");
            assert!(
                e.to_string()
                    .contains("need --cluster etcd://... (or etcds://)"),
                "{e}"
            );
        }
        // With etcd they are taken (the user here; files are read when given).
        let c = parse("--etcd-user alice ls --cluster etcd://127.0.0.1:2379/c").unwrap();
        let etcd = c.cluster.etcd_options().unwrap().unwrap();
        assert_eq!(etcd.user.as_deref(), Some("alice"));
        let e = parse("ls --cluster etcd://127.0.0.1:2379 --etcd-password-file /nonexistent")
            .unwrap()
            .cluster
            .etcd_options()
            .unwrap_err();
        assert!(matches!(e, Error::Etcd(_)), "{e}");
    }
}
