//! The pagestore daemon as a library type: [`Daemon::start`] runs a node (engine shards, QUIC
//! endpoints, the under-storage loader, the admin endpoint, etcd membership when configured)
//! from [`Settings`], and [`Daemon::stop`] stops it and waits until it has stopped. The
//! `pagestored` binary parses its command line ([`Cli`]) into [`Settings`], starts a `Daemon`,
//! waits for SIGTERM or SIGINT and stops it.
//!
//! `start` and `stop` block (the daemon owns its tokio runtime for the under storage): call them
//! from a plain thread, not from inside an async runtime.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{atomic::AtomicU64, Arc},
    time::Duration,
};

use pagestore_engine::{EngineConfig, EngineError};
use pagestore_mounts::{
    etcd::{ClusterState, Etcd, EtcdError, MemberRecord},
    ufs::{MountTable, UfsError, UfsSource},
};
use pagestore_protocol::{
    members::{Membership, MembershipError, NodeInfo},
    node_id::{self, format_uuid, NodeIdError},
    ring::RingConfig,
    tls::{NodeTls, TlsError},
    transport,
};
use pagestore_server::{
    loader::LoaderOptions,
    node::{Node, NodeError, NodeOptions, NodeSource},
};
use tokio::{runtime::Runtime, task::JoinHandle};

use crate::admin::{Admin, RingState};
use crate::writeback::{overlay::WbSource, WriteBackNode, WriteBackSettings};

pub mod cli;
mod membership;
pub mod settings;
#[cfg(test)]
mod tests;

pub use cli::Cli;
pub use settings::{AdminAddr, Resolved, Settings, SettingsError, Size};

/// Why a daemon could not start or stop. The messages are the operator's: they name the
/// setting to change.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The settings are unusable.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// A cache directory cannot be created.
    #[error("cannot create cache directory {}", path.display())]
    CacheDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The node id file cannot be read or created.
    #[error(transparent)]
    NodeId(#[from] NodeIdError),
    /// The TLS material cannot be loaded or created, or does not make a server configuration.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The TLS configuration does not suit QUIC.
    #[error("TLS")]
    Quic(#[source] quinn_proto::crypto::rustls::NoInitialCipherSuite),
    /// More shards than a member record holds.
    #[error("too many shards")]
    TooManyShards,
    /// A cluster node would register an address nobody can connect to.
    #[error(
        "--listen {0} is not an address other machines can reach: members and clients connect \
         to the address the node registers, so listen on this node's own IP"
    )]
    Unreachable(SocketAddr),
    /// The runtime for the under storage cannot start.
    #[error("cannot start the tokio runtime")]
    Runtime(#[source] std::io::Error),
    /// The etcd client cannot be set up.
    #[error("--etcd")]
    Etcd(#[source] EtcdError),
    /// etcd refused this node's credentials.
    #[error("{source} (check --etcd-user and the password for --etcd {url})")]
    EtcdAuth {
        /// The etcd URL.
        url: String,
        /// etcd's answer.
        source: EtcdError,
    },
    /// Joining the cluster in etcd failed.
    #[error("{source} (check --etcd {url} and that etcd runs)")]
    EtcdJoin {
        /// The etcd URL.
        url: String,
        /// What failed.
        source: EtcdError,
    },
    /// Registering this node in etcd failed.
    #[error("cannot register in etcd")]
    Register(#[source] EtcdError),
    /// The member file cannot be read.
    #[error("cannot read member file {}", path.display())]
    MemberFileRead {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The member file is malformed.
    #[error("{}: {message}", path.display())]
    MemberFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The member file does not list this node as it runs.
    #[error("{} {message}", path.display())]
    NotInMemberFile {
        /// The file.
        path: PathBuf,
        /// What it says instead, and what to do.
        message: String,
    },
    /// The members do not make a ring.
    #[error(transparent)]
    Membership(#[from] MembershipError),
    /// A mount cannot be opened (or lies outside the allowed `file://` roots).
    #[error(transparent)]
    Mounts(#[from] UfsError),
    /// The node (engine shards and endpoints) cannot start.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// The admin endpoint cannot listen.
    #[error(
        "cannot serve the admin endpoint on {addr}: {source} (choose another with --admin \
         IP:PORT, or --admin off)"
    )]
    Admin {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Stopping: something still holds the node.
    #[error("shutdown: the node is still in use")]
    StillInUse,
    /// Stopping the engine failed (its index may not have been persisted).
    #[error("shutdown")]
    Shutdown(#[source] EngineError),
    /// The write-back journal cannot be opened.
    #[error(transparent)]
    WriteBack(#[from] crate::writeback::WriteBackError),
    /// The node cannot reach itself as a client (for its peers).
    #[error("this node cannot connect to its own endpoint as a client of its peers")]
    Peers(#[source] pagestore_client::Error),
}

/// This node's id: the one in the first cache directory, created on first use (`pagestored
/// node-id`).
pub fn node_id(settings: &Settings) -> Result<u128, DaemonError> {
    let dirs = settings.cache_dirs_or_default();
    Ok(node_id::load_or_create(&dirs[0].join("node-id"))?)
}

/// A running node. Dropping it stops it too (errors are then only logged).
pub struct Daemon {
    node: Option<Arc<Node>>,
    runtime: Option<Runtime>,
    background: Vec<JoinHandle<()>>,
    /// The etcd connection and this node's lease, when membership lives in etcd.
    etcd: Option<(Arc<Etcd>, Arc<AtomicU64>)>,
    id: u128,
    listen: SocketAddr,
    shards: usize,
    admin: Option<SocketAddr>,
    tls_dir: PathBuf,
    banner: String,
}

/// This node's identity: its id (in the first cache directory) and TLS material.
struct Identity {
    id: u128,
    tls: NodeTls,
    tls_dir: PathBuf,
}

fn identity(c: &Resolved) -> Result<Identity, DaemonError> {
    for d in &c.cache_dirs {
        std::fs::create_dir_all(d).map_err(|source| DaemonError::CacheDir {
            path: d.clone(),
            source,
        })?;
    }
    let first = &c.cache_dirs[0];
    let id = node_id::load_or_create(&first.join("node-id"))?;
    let tls_dir = c.tls_dir.clone().unwrap_or_else(|| first.join("tls"));
    let tls = NodeTls::load_or_create(&tls_dir, &format_uuid(id))?;
    Ok(Identity { id, tls, tls_dir })
}

fn engine_config(c: &Resolved) -> EngineConfig {
    EngineConfig {
        cache_dirs: c.cache_dirs.clone(),
        capacity: c.cache_size,
        page_size: c.page_size,
        shards: c.shards,
        pin_cpus: c.pin,
        reformat: c.reformat,
        policy: c.policy,
        rules: c.rules.clone(),
        dirty_limit: Some(c.dirty_limit),
        ..EngineConfig::default()
    }
}

fn writeback_settings(c: &Resolved) -> WriteBackSettings {
    WriteBackSettings {
        write_replicas: c.write_replicas,
        lease: c.write_lease,
        orphan_grace: c.write_orphan_grace,
        flush_parallel: c.flush_parallel,
        keep_records: c.write_records_keep,
        max_records: c.write_records_max,
        ..WriteBackSettings::default()
    }
}

fn runtime(threads: usize) -> Result<Runtime, DaemonError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("pagestored-ufs")
        .enable_all()
        .build()
        .map_err(DaemonError::Runtime)
}

/// The QUIC server configuration: the node's identity, client certificates from the cluster
/// CA (required or optional).
fn quic_server(
    tls: &NodeTls,
    require_client_cert: bool,
) -> Result<quinn_proto::ServerConfig, DaemonError> {
    let rustls = pagestore_protocol::tls::server_config(
        &tls.identity,
        &tls.ca,
        require_client_cert,
        pagestore_protocol::frame::ALPN,
    )?;
    let crypto = quinn_proto::crypto::rustls::QuicServerConfig::try_from(rustls)
        .map_err(DaemonError::Quic)?;
    let mut server = quinn_proto::ServerConfig::with_crypto(Arc::new(crypto));
    server.transport_config(transport::transport_config());
    Ok(server)
}

fn node_options(
    c: &Resolved,
    id: u128,
    server: quinn_proto::ServerConfig,
    membership: &Membership,
    source: Arc<dyn pagestore_protocol::source::Source>,
    writeback: Arc<WriteBackNode>,
    rt: &Runtime,
) -> NodeOptions {
    let max_request = c.page_size as usize + (64 << 10);
    NodeOptions {
        listen: c.listen,
        server: Arc::new(server),
        node_id: id,
        ring: Arc::new(membership.ring().clone()),
        max_request,
        // One connection may hold up to 4 pages of writes from the node's budget.
        max_buffered: 4 * max_request,
        limits: c.limits.clone(),
        source: Some(NodeSource {
            source,
            runtime: rt.handle().clone(),
            options: LoaderOptions {
                max_inflight: c.ufs_inflight,
                metadata_ttl: c.metadata_ttl,
                ..LoaderOptions::default()
            },
        }),
        nodes: membership::node_entries(membership),
        replicas: c.replicas,
        writeback: Some(writeback),
        memory_cache: c.memory_cache,
        spread: c.spread,
    }
}

fn serve_admin(
    rt: &Runtime,
    admin: &Arc<Admin>,
    addr: Option<SocketAddr>,
) -> Result<Option<SocketAddr>, DaemonError> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    rt.block_on(crate::admin::serve(admin.clone(), addr))
        .map(Some)
        .map_err(|source| DaemonError::Admin { addr, source })
}

impl Daemon {
    /// Starts a node with `settings` (defaults filled in by [`Settings::resolve`]) and returns
    /// once it serves. Blocks; call it outside any async runtime.
    pub fn start(settings: Settings) -> Result<Daemon, DaemonError> {
        let mut c = settings.resolve()?;
        let me = identity(&c)?;
        let engine = engine_config(&c);
        let shards = engine.resolved_shards();
        let info = NodeInfo {
            id: me.id,
            addr: c.listen,
            shards: u16::try_from(shards).map_err(|_| DaemonError::TooManyShards)?,
        };
        if (c.members.is_some() || c.etcd.is_some()) && c.listen.ip().is_unspecified() {
            return Err(DaemonError::Unreachable(c.listen));
        }
        let rt = runtime(c.ufs_threads)?;
        // This node's own mounts, with their credentials (etcd's table holds none).
        let local_mounts = c.mounts.clone();
        let joined = membership::join(&rt, &mut c, info)?;
        let epoch = joined.etcd.as_ref().map_or(1, |(_, s)| s.revision.max(1));
        let ring = Membership::new(joined.nodes.iter().copied(), RingConfig::default(), epoch)?;
        let mounts = {
            let _guard = rt.enter();
            MountTable::new_confined(&c.mounts, &c.file_roots)?
        };
        let source = Arc::new(UfsSource::new(Arc::new(mounts)));
        // Anonymous readers may read everything the mounts hold: by default only on a loopback
        // address (a single machine's own users), never on a network unless asked for.
        let require_client_cert = c
            .require_client_cert
            .unwrap_or(!c.listen.ip().is_loopback());
        let server = quic_server(&me.tls, require_client_cert)?;
        let wb = WriteBackNode::open(
            &c.cache_dirs[0].join("writeback"),
            me.id,
            writeback_settings(&c),
            source.clone(),
            ring.nodes().count(),
            rt.handle().clone(),
        )?;
        let overlay = Arc::new(WbSource::new(source.clone(), wb.clone()));
        let options = node_options(&c, me.id, server, &ring, overlay, wb.clone(), &rt);
        let node = Arc::new(Node::start(engine, options)?);
        // This node's client of its peers (and of itself): its own certificate, role `node`.
        let peers = {
            let tls = pagestore_client::tls::config_for(&me.tls.ca, Some(&me.tls.identity))
                .map_err(DaemonError::Peers)?;
            let seed = node.addrs()[0];
            let options = pagestore_client::ClientOptions {
                membership_refresh: Duration::from_secs(2),
                ..pagestore_client::ClientOptions::default()
            };
            rt.block_on(pagestore_client::Client::connect(
                &pagestore_client::ClusterSource::Addr(seed),
                tls,
                Some(source.table()),
                options,
            ))
            .map_err(DaemonError::Peers)?
        };
        let admin = Arc::new(Admin {
            node: Arc::downgrade(&node),
            ring: std::sync::RwLock::new(RingState {
                membership: Arc::new(ring.clone()),
                down: Vec::new(),
                mode: joined
                    .etcd
                    .as_ref()
                    .map_or("file", |(_, s)| s.mode().as_str()),
            }),
            etcd: joined.etcd.as_ref().map(|(e, _)| e.clone()),
            writeback: Some(wb.clone()),
        });
        let admin_addr = serve_admin(&rt, &admin, c.admin)?;
        let background = {
            let _guard = rt.enter();
            wb.run(&node, peers)
        };
        let mut daemon = Daemon {
            node: Some(node),
            runtime: None,
            background,
            etcd: None,
            id: me.id,
            listen: c.listen,
            shards,
            admin: admin_addr,
            tls_dir: me.tls_dir,
            banner: String::new(),
        };
        if let Some((e, state)) = &joined.etcd {
            daemon.follow_etcd(&rt, &c, (e, state), info, &admin, &source, &local_mounts)?;
        }
        daemon.banner = banner(
            &daemon,
            &c,
            &ring,
            &joined.etcd,
            &source,
            require_client_cert,
        );
        daemon.runtime = Some(rt);
        Ok(daemon)
    }

    /// With etcd: registers this node (with its admin address) and follows membership.
    #[allow(clippy::too_many_arguments)]
    fn follow_etcd(
        &mut self,
        rt: &Runtime,
        c: &Resolved,
        (e, state): (&Arc<Etcd>, &ClusterState),
        info: NodeInfo,
        admin: &Arc<Admin>,
        source: &Arc<UfsSource>,
        local_mounts: &[(String, String)],
    ) -> Result<(), DaemonError> {
        let Some(node) = &self.node else {
            return Ok(());
        };
        let rec = MemberRecord {
            info,
            admin: self.admin.map(|a| a.to_string()),
        };
        let follow = membership::Follow {
            node,
            admin,
            source,
            roots: &c.file_roots,
            local_mounts,
        };
        let r = membership::register(rt, e, state, rec, c.lease_ttl, follow)?;
        self.background.extend(r.tasks);
        self.etcd = Some((e.clone(), r.lease));
        Ok(())
    }

    /// This node's id.
    pub fn node_id(&self) -> u128 {
        self.id
    }

    /// The QUIC base address (shard `i` on port + `i`).
    pub fn listen(&self) -> SocketAddr {
        self.listen
    }

    /// The number of engine shards (= QUIC endpoints).
    pub fn shards(&self) -> usize {
        self.shards
    }

    /// Where the admin endpoint listens (the port chosen, for port 0), if it runs.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin
    }

    /// The TLS directory (the cluster CA certificate, `ca-cert.pem`, is there).
    pub fn tls_dir(&self) -> &std::path::Path {
        &self.tls_dir
    }

    /// What the node runs with, in lines for the operator (`pagestored` prints them at start).
    pub fn banner(&self) -> &str {
        &self.banner
    }

    /// Stops the node: leaves etcd, closes every connection (clients get an error at once),
    /// persists the engine's index and stops the runtime; returns when all is stopped.
    pub fn stop(mut self) -> Result<(), DaemonError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), DaemonError> {
        for t in self.background.drain(..) {
            t.abort();
        }
        if let (Some((e, lease)), Some(rt)) = (self.etcd.take(), &self.runtime) {
            membership::leave(rt, &e, &lease);
        }
        // The node first (in-flight requests may still need the under-storage runtime), then
        // the runtime.
        let stopped = match self.node.take() {
            Some(node) => stop_node(node),
            None => Ok(()),
        };
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
        stopped
    }
}

/// Stops the node once nobody else holds it. The admin endpoint and the membership task hold
/// only weak references: wait for a membership update that is being applied right now.
fn stop_node(mut node: Arc<Node>) -> Result<(), DaemonError> {
    let node = loop {
        match Arc::try_unwrap(node) {
            Ok(n) => break n,
            Err(n) if Arc::weak_count(&n) > 0 => {
                node = n;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => return Err(DaemonError::StillInUse),
        }
    };
    node.shutdown().map_err(DaemonError::Shutdown)
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::error!(error = %e, "stopping the node");
        }
    }
}

/// The lines `pagestored` prints at start: the node, its caches, mounts, rules, TLS, admin
/// endpoint and members.
fn banner(
    d: &Daemon,
    c: &Resolved,
    ring: &Membership,
    etcd: &Option<(Arc<Etcd>, ClusterState)>,
    source: &UfsSource,
    require_client_cert: bool,
) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let shards = u16::try_from(d.shards).unwrap_or(u16::MAX);
    let last_port = c.listen.port().saturating_add(shards.saturating_sub(1));
    let _ = writeln!(
        s,
        "pagestored: node {} serving {} shard(s) on {} (UDP ports {}-{})",
        format_uuid(d.id),
        d.shards,
        c.listen.ip(),
        c.listen.port(),
        last_port
    );
    for dir in &c.cache_dirs {
        let _ = writeln!(
            s,
            "  cache      {} ({} bytes over all directories)",
            dir.display(),
            c.cache_size
        );
    }
    for (prefix, url) in source.table().mounts() {
        let prefix = if prefix.is_empty() { "/" } else { prefix };
        let _ = writeln!(
            s,
            "  mount      {prefix} <- {}",
            pagestore_mounts::ufs::redact(url)
        );
    }
    for (_, rule) in c.rules.iter() {
        let _ = writeln!(s, "  rule       {}", crate::rules::describe(rule));
    }
    let who = if require_client_cert {
        "clients need a certificate from the cluster CA"
    } else {
        "readers without a certificate allowed"
    };
    let _ = writeln!(s, "  tls        {} ({who})", d.tls_dir.display());
    if let Some(a) = d.admin {
        let _ = writeln!(s, "  admin      http://{a}/metrics");
    }
    let _ = match (etcd, &c.members) {
        (Some((_, st)), _) => write!(
            s,
            "  members    {} node(s) in the {} ring, from {} (lease TTL {:?})",
            ring.nodes().count(),
            st.mode().as_str(),
            c.etcd.as_deref().unwrap_or_default(),
            c.lease_ttl
        ),
        (None, Some(p)) => write!(
            s,
            "  members    {} node(s) from {}",
            ring.nodes().count(),
            p.display()
        ),
        (None, None) => write!(s, "  members    this node alone"),
    };
    s
}
