//! `pagestored`: the pagestore daemon. One process per machine: an engine shard per core, each
//! serving its slice of the ring over QUIC and loading misses from the under storage.
//!
//! With no arguments it runs the embedded single-node default: cache in
//! `$PAGESTORE_HOME/cache`, the local directory `$PAGESTORE_HOME/data` mounted at `/data`,
//! QUIC on 127.0.0.1:7400. The daemon itself is [`pagestore_tools::daemon::Daemon`]; this is
//! its command line (see `pagestored --help` and docs/OPERATIONS.md).

use anyhow::Context;
use clap::{error::ErrorKind, Parser};
use pagestore_cli::init_logging;
use pagestore_protocol::node_id::format_uuid;
use pagestore_tools::daemon::{self, cli::Command, Cli, Daemon};

fn main() {
    init_logging();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => usage_error(e),
    };
    if let Err(e) = run(cli) {
        eprintln!("pagestored: {}", pagestore_cli::error_chain(&e));
        std::process::exit(2);
    }
}

/// Prints a command-line error (or the help) and exits: 0 for `--help`, else 2.
fn usage_error(e: clap::Error) -> ! {
    if e.kind() == ErrorKind::UnknownArgument {
        if let Some(arg) = e.get(clap::error::ContextKind::InvalidArg) {
            eprintln!("pagestored: unknown argument {:?}", arg.to_string());
        }
    }
    e.exit()
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let node_id = matches!(cli.command, Some(Command::NodeId));
    let settings = cli.settings()?;
    if node_id {
        println!("{}", format_uuid(daemon::node_id(&settings)?));
        return Ok(());
    }
    let d = Daemon::start(settings)?;
    let signals = Signals::watch()?;
    println!("{}", d.banner());
    println!("ready: try `pagectl ls /` (stop with Ctrl-C)");
    let signal = signals.wait();
    tracing::info!(
        signal,
        "shutting down: closing connections, persisting the index"
    );
    d.stop()?;
    println!("pagestored: stopped");
    Ok(())
}

/// SIGINT and SIGTERM, watched from before the daemon says it is ready.
struct Signals {
    rt: tokio::runtime::Runtime,
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn watch() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the signal runtime")?;
        let guard = rt.enter();
        let int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
        let term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
        drop(guard);
        Ok(Signals { rt, int, term })
    }

    /// Waits for one of them and names it.
    fn wait(mut self) -> &'static str {
        self.rt.block_on(async {
            tokio::select! {
                _ = self.int.recv() => "SIGINT",
                _ = self.term.recv() => "SIGTERM",
            }
        })
    }
}
