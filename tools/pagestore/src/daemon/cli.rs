//! `pagestored`'s command line (clap): the flags, each overriding the config file's setting of
//! the same name ([`Settings`]), and the `node-id` subcommand.

use std::{net::SocketAddr, path::PathBuf};

use clap::{Parser, Subcommand};
use pagestore_engine::{PolicyKind, Rule};
use pagestore_mounts::{etcd::RingMode, ufs::parse_mount};

use super::settings::{parse_policy, AdminAddr, Settings, SettingsError, Size};

/// `pagestored`'s command line.
#[derive(Debug, Parser)]
#[command(
    name = "pagestored",
    about = "The pagestore daemon: runs a node (no options: the embedded single-node default).",
    long_about = "The pagestore daemon: runs a node (no options: the embedded single-node \
                  default: cache in $PAGESTORE_HOME/cache, the directory $PAGESTORE_HOME/data \
                  mounted at /data, QUIC on 127.0.0.1:7400, admin on 127.0.0.1:7399).\n\n\
                  Each option may also be set in the TOML file given with --config or \
                  PAGESTORE_CONFIG, with underscores (cache_size = \"3T\"; see \
                  docs/OPERATIONS.md); flags win over the file, and a repeatable flag given on \
                  the command line replaces the file's list.",
    after_help = "PAGESTORE_HOME defaults to /var/tmp/pagestore; PAGESTORE_LOG sets the log \
                  level; PAGESTORE_ETCD_USER, PAGESTORE_ETCD_PASSWORD(_FILE), \
                  PAGESTORE_ETCD_CA, PAGESTORE_ETCD_CERT and PAGESTORE_ETCD_KEY stand in for \
                  the --etcd-* flags.",
    args_override_self = true,
    disable_version_flag = true
)]
pub struct Cli {
    /// What to do (default: run the node).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// TOML configuration (see docs/OPERATIONS.md).
    #[arg(long, value_name = "FILE", env = "PAGESTORE_CONFIG", global = true)]
    pub config: Option<PathBuf>,
    /// The settings.
    #[command(flatten)]
    pub flags: Flags,
}

/// `pagestored`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print this node's UUID (created on first use) and exit.
    NodeId,
}

/// The flags of the settings (each one [`Settings`] field; see [`Flags::into_settings`]).
#[derive(Debug, Default, clap::Args)]
pub struct Flags {
    /// Eviction policy (default lru; s3fifo resists scans).
    #[arg(long, value_name = "lru|s3fifo", value_parser = parse_policy)]
    pub policy: Option<PolicyKind>,
    /// Cache directory, repeatable (default $PAGESTORE_HOME/cache).
    #[arg(long, value_name = "DIR", global = true)]
    pub cache_dir: Vec<PathBuf>,
    /// Cache capacity over all directories (default 1G).
    #[arg(long, value_name = "SIZE")]
    pub cache_size: Option<Size>,
    /// RAM for the hottest pages, over all shards, in front of the disk cache: served without
    /// a disk read, admitted S3-FIFO style so scans pass it by (default 0: off).
    #[arg(long, value_name = "SIZE")]
    pub memory_cache: Option<Size>,
    /// Page size, 64K..64M (default 4M).
    #[arg(long, value_name = "SIZE")]
    pub page_size: Option<Size>,
    /// Engine shards (default: one per CPU).
    #[arg(long, value_name = "N")]
    pub shards: Option<usize>,
    /// A mount, repeatable (default /data=file://$PAGESTORE_HOME/data); URL: file:///dir or
    /// s3://bucket/prefix?endpoint=..&region=..
    #[arg(long, value_name = "/LOGICAL=URL", value_parser = parse_mount)]
    pub mount: Vec<(String, String)>,
    /// file:// mounts (from flags, config or etcd) must lie beneath one of these directories,
    /// repeatable (default: the directories of this node's own file:// mounts).
    #[arg(long, value_name = "DIR")]
    pub allow_file_root: Vec<PathBuf>,
    /// QUIC base address; shard i uses port+i (default 127.0.0.1:7400).
    #[arg(long, value_name = "IP:PORT")]
    pub listen: Option<SocketAddr>,
    /// Static member list (default: this node alone).
    #[arg(long, value_name = "FILE")]
    pub members: Option<PathBuf>,
    /// Membership and mounts in etcd instead: etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]
    /// (etcds:// for TLS).
    #[arg(long, value_name = "URL")]
    pub etcd: Option<String>,
    /// With etcd: log in as USER; the password comes from --etcd-password-file FILE or
    /// $PAGESTORE_ETCD_PASSWORD.
    #[arg(long, value_name = "USER")]
    pub etcd_user: Option<String>,
    /// With etcd: file holding the password (first line).
    #[arg(long, value_name = "FILE")]
    pub etcd_password_file: Option<PathBuf>,
    /// With etcds://: CA certificate(s) that sign etcd's certificate.
    #[arg(long, value_name = "FILE")]
    pub etcd_ca: Option<PathBuf>,
    /// With etcds://: client certificate for etcd.
    #[arg(long, value_name = "FILE")]
    pub etcd_cert: Option<PathBuf>,
    /// With etcds://: key of the client certificate for etcd.
    #[arg(long, value_name = "FILE")]
    pub etcd_key: Option<PathBuf>,
    /// With etcd: dynamic (live members only, the default) or static (members keep their
    /// slot while down); the first node sets it.
    #[arg(long, value_name = "MODE")]
    pub ring_mode: Option<RingMode>,
    /// With etcd: membership lease TTL (default 10); a dead node leaves the live set this long
    /// after it stops renewing.
    #[arg(long, value_name = "SECS")]
    pub lease_ttl: Option<f64>,
    /// TLS material (default <first cache dir>/tls).
    #[arg(long, value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,
    /// Refuse clients without a certificate from the cluster CA (the default unless --listen
    /// is a loopback address).
    #[arg(long, overrides_with = "allow_anonymous")]
    pub require_client_cert: bool,
    /// Serve readers without a certificate even on a non-loopback address (they may read
    /// everything the mounts hold).
    #[arg(long, overrides_with = "require_client_cert")]
    pub allow_anonymous: bool,
    /// Connections each shard accepts at once (default 1024).
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Connections each shard accepts from one IP address (default 128).
    #[arg(long, value_name = "N")]
    pub max_connections_per_ip: Option<usize>,
    /// Request bytes the node holds for all clients together (partly received and being
    /// served; default 256M, at least page size + 64K).
    #[arg(long, value_name = "SIZE")]
    pub max_partial_bytes: Option<Size>,
    /// Reset a request whose bytes stop arriving this long (default 10).
    #[arg(long, value_name = "SECS")]
    pub request_stall_timeout: Option<f64>,
    /// New connections per second and shard above which clients must prove their address
    /// with a QUIC Retry (default 128; 0: always).
    #[arg(long, value_name = "N")]
    pub retry_rate: Option<u32>,
    /// How long file metadata and listings are cached (default 10).
    #[arg(long, value_name = "SECS")]
    pub metadata_ttl: Option<f64>,
    /// Replicas clients may try before the under storage (default 0).
    #[arg(long, value_name = "N")]
    pub replicas: Option<u8>,
    /// Under-storage requests in flight per shard (default 16).
    #[arg(long, value_name = "N")]
    pub ufs_inflight: Option<usize>,
    /// Threads running under-storage requests (default 2).
    #[arg(long, value_name = "N")]
    pub ufs_threads: Option<usize>,
    /// Admin HTTP endpoint: /health, /metrics, /v1/ring (default 127.0.0.1:7399; port 0 picks
    /// a free one; off disables it).
    #[arg(long, value_name = "IP:PORT|off")]
    pub admin: Option<AdminAddr>,
    /// Rebuild cache files made with other settings (drops their pages).
    #[arg(long)]
    pub reformat: bool,
    /// Pin shard i to the i-th allowed CPU (when there are no more shards than CPUs): for a
    /// machine whose cores are left to pagestored; off by default (config: pin = true).
    #[arg(long, conflicts_with = "no_pin")]
    pub pin: bool,
    /// Leave the shards unpinned: the default (config: pin = false).
    #[arg(long)]
    pub no_pin: bool,
    /// A cache rule for files under PREFIX, repeatable: quota=SIZE (bytes of this node's
    /// cache), ttl=DURATION (500ms, 30s, 2h, 7d), pin=true; the longest prefix wins (config:
    /// [[rule]] tables).
    #[arg(long = "rule", value_name = "PREFIX:KEY=VALUE,...", value_parser = crate::rules::parse_rule)]
    pub rules: Vec<Rule>,
    /// Nodes that keep each page and record of a file written to a write=back or
    /// write=transient mount before the write is acknowledged (default 2; at most the nodes).
    #[arg(long, value_name = "N")]
    pub write_replicas: Option<u8>,
    /// Bytes of dirty pages (written, not flushed yet) this node holds; writers wait for
    /// flushes beyond it (default half the cache size).
    #[arg(long, value_name = "SIZE")]
    pub dirty_limit: Option<Size>,
    /// Files this node flushes to the under storage at once (default 32; large files 4 at a
    /// time, by the memory their flushes hold).
    #[arg(long, value_name = "N")]
    pub flush_parallel: Option<usize>,
    /// Seal and flush a file whose writer has been silent this long (default 120).
    #[arg(long, value_name = "SECS")]
    pub write_lease: Option<f64>,
    /// Drop the pages of a write-back file that was never committed this long after its
    /// writer last sent or renewed one (a writer gone before its first commit; default 120).
    #[arg(long, value_name = "SECS")]
    pub write_orphan_grace: Option<f64>,
    /// Forget a write-back file's record this long after its last write once it is flushed
    /// (the store's object from then on), and a deletion's once the store applied it
    /// (default 86400).
    #[arg(long, value_name = "SECS")]
    pub write_records_keep: Option<f64>,
    /// Write-back records (files, directories, deletions) a node keeps, at most: past it,
    /// changes that add a path fail with "no space" until flushed ones are forgotten
    /// (default 1000000, about 0.8 KB of memory each with 60-byte paths).
    #[arg(long, value_name = "N")]
    pub write_records_max: Option<usize>,
    /// Members a hot page is served by, counting its owner, on distinct nodes (default 3, at
    /// most the nodes; 1 turns hot-page replicas off).
    #[arg(long, value_name = "N")]
    pub hot_replicas: Option<u8>,
    /// Reads per second of one page that make it hot (default 20).
    #[arg(long, value_name = "READS")]
    pub hot_threshold: Option<f64>,
    /// Drop a copy of a hot page that nobody read for this long (default 30).
    #[arg(long, value_name = "SECS")]
    pub hot_cool: Option<f64>,
}

impl Flags {
    /// The settings these flags give (`None` where a flag is absent).
    pub fn into_settings(self) -> Settings {
        let list = |v: Vec<PathBuf>| (!v.is_empty()).then_some(v);
        Settings {
            cache_dirs: list(self.cache_dir),
            cache_size: self.cache_size,
            memory_cache: self.memory_cache,
            page_size: self.page_size,
            shards: self.shards,
            policy: self.policy,
            mounts: (!self.mount.is_empty()).then_some(self.mount),
            allow_file_roots: list(self.allow_file_root),
            listen: self.listen,
            members: self.members,
            etcd: self.etcd,
            etcd_user: self.etcd_user,
            etcd_password_file: self.etcd_password_file,
            etcd_ca: self.etcd_ca,
            etcd_cert: self.etcd_cert,
            etcd_key: self.etcd_key,
            ring_mode: self.ring_mode,
            lease_ttl: self.lease_ttl,
            tls_dir: self.tls_dir,
            require_client_cert: if self.require_client_cert {
                Some(true)
            } else if self.allow_anonymous {
                Some(false)
            } else {
                None
            },
            max_connections: self.max_connections,
            max_connections_per_ip: self.max_connections_per_ip,
            max_partial_bytes: self.max_partial_bytes,
            request_stall_timeout: self.request_stall_timeout,
            retry_rate: self.retry_rate,
            metadata_ttl: self.metadata_ttl,
            replicas: self.replicas,
            ufs_inflight: self.ufs_inflight,
            ufs_threads: self.ufs_threads,
            admin: self.admin,
            pin: if self.pin {
                Some(true)
            } else {
                self.no_pin.then_some(false)
            },
            rules: (!self.rules.is_empty()).then_some(self.rules),
            write_replicas: self.write_replicas,
            dirty_limit: self.dirty_limit,
            flush_parallel: self.flush_parallel,
            write_lease: self.write_lease,
            write_orphan_grace: self.write_orphan_grace,
            write_records_keep: self.write_records_keep,
            write_records_max: self.write_records_max,
            hot_replicas: self.hot_replicas,
            hot_threshold: self.hot_threshold,
            hot_cool: self.hot_cool,
            reformat: self.reformat,
        }
    }
}

impl Cli {
    /// The settings in force: the config file's (if `--config` or `PAGESTORE_CONFIG` names
    /// one) with the flags over them.
    pub fn settings(self) -> Result<Settings, SettingsError> {
        let flags = self.flags.into_settings();
        match &self.config {
            Some(path) => Ok(Settings::from_file(path)?.overridden_by(flags)),
            None => Ok(flags),
        }
    }
}
