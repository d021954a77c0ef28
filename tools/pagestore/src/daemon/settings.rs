//! `pagestored`'s settings: one struct that the TOML config file fills and the command line
//! overrides, and its resolution into what the node runs with (defaults, checks, the embedded
//! single-node default's data directory).

use std::{
    collections::BTreeMap,
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
    str::FromStr,
    sync::Arc,
    time::Duration,
};

use pagestore_engine::{PolicyKind, Rule, Rules, StartError};
use pagestore_mounts::{
    etcd::{self, EtcdError, EtcdOptions, RingMode},
    ufs::{FileRoots, UfsError},
};
use pagestore_server::spread::SpreadConfig;
use serde::{de, Deserialize, Deserializer};

use crate::rules::RuleConfig;
use pagestore_cli::{home, parse_size, DEFAULT_LISTEN};

/// Every setting of `pagestored`. The config file (`--config FILE`, TOML) holds any of them
/// under these names; a flag of the same meaning (`cache_size` is `--cache-size`) wins over the
/// file ([`Settings::overridden_by`]). `None` (or a missing key) means the default, which
/// [`Settings::resolve`] fills in. See docs/OPERATIONS.md for what each one means.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Cache directories (default `$PAGESTORE_HOME/cache`); the first holds `node-id`.
    pub cache_dirs: Option<Vec<PathBuf>>,
    /// Capacity over all directories (default 1G).
    pub cache_size: Option<Size>,
    /// RAM for the hottest pages over all shards, in front of the disk cache (default 0: off).
    pub memory_cache: Option<Size>,
    /// Page size, 64K to 64M (default 4M).
    pub page_size: Option<Size>,
    /// Engine shards (default, and 0: one per CPU).
    pub shards: Option<usize>,
    /// Eviction policy (default LRU).
    #[serde(default, deserialize_with = "policy")]
    pub policy: Option<PolicyKind>,
    /// `(logical prefix, URL)` mounts (default `/data=file://$PAGESTORE_HOME/data`); the file's
    /// `[mounts]` table, the flags' `--mount /LOGICAL=URL`.
    #[serde(default, deserialize_with = "mounts")]
    pub mounts: Option<Vec<(String, String)>>,
    /// Directories `file://` mounts must lie beneath (default: those of this node's own
    /// `file://` mounts).
    pub allow_file_roots: Option<Vec<PathBuf>>,
    /// QUIC base address; shard `i` on port + `i` (default 127.0.0.1:7400).
    pub listen: Option<SocketAddr>,
    /// Static member file (default: this node alone).
    pub members: Option<PathBuf>,
    /// Membership and mounts in etcd: `etcd://HOST:PORT[,...][/CLUSTER]` or `etcds://`.
    pub etcd: Option<String>,
    /// etcd user (over `PAGESTORE_ETCD_USER`).
    pub etcd_user: Option<String>,
    /// File holding the etcd password (over `PAGESTORE_ETCD_PASSWORD_FILE` and
    /// `PAGESTORE_ETCD_PASSWORD`).
    pub etcd_password_file: Option<PathBuf>,
    /// CA certificate(s) of etcd's server certificate (over `PAGESTORE_ETCD_CA`).
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate for etcd (over `PAGESTORE_ETCD_CERT`).
    pub etcd_cert: Option<PathBuf>,
    /// Key of the client certificate for etcd (over `PAGESTORE_ETCD_KEY`).
    pub etcd_key: Option<PathBuf>,
    /// With etcd: which members hold ring slots (default dynamic).
    #[serde(default, deserialize_with = "ring_mode")]
    pub ring_mode: Option<RingMode>,
    /// With etcd: membership lease TTL in seconds, 2 to 3600 (default 10).
    pub lease_ttl: Option<f64>,
    /// TLS material (default `<first cache dir>/tls`).
    pub tls_dir: Option<PathBuf>,
    /// Refuse clients without a certificate from the cluster CA (default: unless `listen` is
    /// a loopback address). `false` is `--allow-anonymous`.
    pub require_client_cert: Option<bool>,
    /// Connections each shard accepts at once (default 1024).
    pub max_connections: Option<usize>,
    /// Connections each shard accepts from one IP address (default 128).
    pub max_connections_per_ip: Option<usize>,
    /// Request bytes the node holds for all clients together (default 256M).
    pub max_partial_bytes: Option<Size>,
    /// Seconds after which a request whose bytes stopped arriving is reset, 0.1 to 3600
    /// (default 10).
    pub request_stall_timeout: Option<f64>,
    /// New connections per second and shard above which clients get a QUIC Retry (default
    /// 128; 0: always).
    pub retry_rate: Option<u32>,
    /// Seconds file metadata and listings are cached (default 10).
    pub metadata_ttl: Option<f64>,
    /// Replicas clients may try before the under storage (default 0).
    pub replicas: Option<u8>,
    /// Under-storage requests in flight per shard (default 16).
    pub ufs_inflight: Option<usize>,
    /// Threads running under-storage requests (default 2).
    pub ufs_threads: Option<usize>,
    /// Admin HTTP endpoint (default 127.0.0.1:7399).
    pub admin: Option<AdminAddr>,
    /// Pin shards to CPUs (default false; `--pin` is `true`, `--no-pin` is `false`).
    pub pin: Option<bool>,
    /// Cache rules per logical-path prefix: the file's `[[rule]]` tables, the flags' `--rule`.
    #[serde(rename = "rule", default, deserialize_with = "rules")]
    pub rules: Option<Vec<Rule>>,
    /// Nodes that keep each page and record of a file written to a `back` or `transient`
    /// mount before the write is acknowledged (default 2, at most the number of nodes).
    pub write_replicas: Option<u8>,
    /// Bytes of dirty pages (written through the cluster, not flushed yet) the node holds
    /// (default half the cache size); writers wait for flushes beyond it.
    pub dirty_limit: Option<Size>,
    /// Files the node flushes to the under storage at once (default 32; large files four at a
    /// time, by the memory their flushes hold).
    pub flush_parallel: Option<usize>,
    /// Seconds after which a file whose writer went silent is sealed and flushed without it,
    /// 5 to 86400 (default 120).
    pub write_lease: Option<f64>,
    /// Seconds after which the pages of a write-back file that was never committed are
    /// dropped, counted from its writer's last page or renewal, 1 to 86400 (default 120).
    pub write_orphan_grace: Option<f64>,
    /// Seconds a flushed file's record (and an applied deletion's) is kept after the change
    /// that made it, 1 to 31536000 (default 86400); a forgotten file is the store's object.
    pub write_records_keep: Option<f64>,
    /// Write-back records a node keeps, at most (default 1000000): past it, changes that add
    /// a path are refused until flushed ones are forgotten.
    pub write_records_max: Option<usize>,
    /// Members a hot page is served by, counting its owner, on distinct nodes (default 3, at
    /// most the nodes; 1: hot-page replicas off).
    pub hot_replicas: Option<u8>,
    /// Reads per second of one page that make it hot, above 0 (default 20).
    pub hot_threshold: Option<f64>,
    /// Seconds after which a copy of a hot page that nobody read is dropped, 1 to 86400
    /// (default 30).
    pub hot_cool: Option<f64>,
    /// Rebuild cache files made with other settings (`--reformat`; not a config-file key).
    #[serde(skip)]
    pub reformat: bool,
}

/// A byte size: `"4M"`, `"64KiB"`, `"1G"` or a plain number of bytes (see
/// [`pagestore_cli::parse_size`]), in the config file as a string or an integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size(pub u64);

impl FromStr for Size {
    type Err = String;
    fn from_str(s: &str) -> Result<Size, String> {
        parse_size(s).map(Size)
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Size, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size: bytes, or a string such as \"4M\" or \"100G\"")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Size, E> {
                s.parse().map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Size, E> {
                Ok(Size(n))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Size, E> {
                u64::try_from(n)
                    .map(Size)
                    .map_err(|_| E::custom(format!("{n} is not a size")))
            }
        }
        d.deserialize_any(V)
    }
}

/// Where the admin endpoint listens: an address (port 0 picks a free one) or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminAddr {
    /// No admin endpoint.
    Off,
    /// Serve on this address.
    At(SocketAddr),
}

impl FromStr for AdminAddr {
    type Err = String;
    fn from_str(v: &str) -> Result<AdminAddr, String> {
        if v == "off" {
            return Ok(AdminAddr::Off);
        }
        v.parse()
            .map(AdminAddr::At)
            .map_err(|e| format!("{v:?}: {e} (IP:PORT or off)"))
    }
}

impl<'de> Deserialize<'de> for AdminAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<AdminAddr, D::Error> {
        String::deserialize(d)?.parse().map_err(de::Error::custom)
    }
}

/// Parses an eviction policy name (`lru`, `s3fifo`).
pub fn parse_policy(v: &str) -> Result<PolicyKind, String> {
    v.parse().map_err(|_| format!("{v:?}: use lru or s3fifo"))
}

fn policy<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PolicyKind>, D::Error> {
    parse_policy(&String::deserialize(d)?)
        .map(Some)
        .map_err(de::Error::custom)
}

fn ring_mode<'de, D: Deserializer<'de>>(d: D) -> Result<Option<RingMode>, D::Error> {
    String::deserialize(d)?
        .parse()
        .map(Some)
        .map_err(de::Error::custom)
}

/// The `[mounts]` table: logical prefix (starting with `/`; a trailing `/` is dropped, as in
/// `--mount`) to URL, in the table's (sorted) order.
fn mounts<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<(String, String)>>, D::Error> {
    let table = BTreeMap::<String, String>::deserialize(d)?;
    let mut out = Vec::new();
    for (prefix, url) in table {
        if !prefix.starts_with('/') {
            return Err(de::Error::custom(format!(
                "mount {prefix:?}: the logical prefix must start with /"
            )));
        }
        out.push((prefix.trim_end_matches('/').to_string(), url));
    }
    Ok(Some(out))
}

fn rules<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Rule>>, D::Error> {
    Vec::<RuleConfig>::deserialize(d)?
        .iter()
        .map(RuleConfig::to_rule)
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
        .map_err(de::Error::custom)
}

/// Why the settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The config file cannot be read.
    #[error("cannot read config file {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The config file is not valid TOML, holds an unknown key or a bad value.
    #[error("config file {}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        source: toml::de::Error,
    },
    /// A setting is out of range or does not go with another; the message names the flag.
    #[error("{0}")]
    Invalid(String),
    /// The embedded default's data directory cannot be created.
    #[error("cannot create the default data directory {}", path.display())]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A `--allow-file-root` directory is missing or not a directory.
    #[error(transparent)]
    FileRoots(#[from] UfsError),
    /// The cache rules do not go together (a prefix twice, a quota below a page per shard).
    #[error(transparent)]
    Rules(#[from] StartError),
    /// The etcd settings (or their `PAGESTORE_ETCD_*` variables) are unusable.
    #[error(transparent)]
    Etcd(#[from] EtcdError),
}

/// A duration given in seconds (`flag`'s value `v`, `None`: `default`), within `lo..=hi`.
fn seconds(
    flag: &str,
    v: Option<f64>,
    (lo, hi): (f64, f64),
    default: Duration,
) -> Result<Duration, SettingsError> {
    match v {
        None => Ok(default),
        Some(v) if (lo..=hi).contains(&v) => Ok(Duration::from_secs_f64(v)),
        Some(v) => Err(invalid(format!("{flag} {v}: use {lo} to {hi} seconds"))),
    }
}

fn invalid(msg: impl Into<String>) -> SettingsError {
    SettingsError::Invalid(msg.into())
}

impl Settings {
    /// Reads the TOML config file at `path`. Unknown keys are an error naming them and the file.
    pub fn from_file(path: &Path) -> Result<Settings, SettingsError> {
        let text = std::fs::read_to_string(path).map_err(|source| SettingsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Settings::from_toml(&text).map_err(|source| SettingsError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Parses config-file text.
    pub fn from_toml(text: &str) -> Result<Settings, toml::de::Error> {
        toml::from_str(text)
    }

    /// These settings with every setting that `flags` gives replacing this one's: a list given
    /// on the command line (cache directories, mounts, file roots, rules) replaces the file's.
    pub fn overridden_by(self, flags: Settings) -> Settings {
        Settings {
            cache_dirs: flags.cache_dirs.or(self.cache_dirs),
            cache_size: flags.cache_size.or(self.cache_size),
            memory_cache: flags.memory_cache.or(self.memory_cache),
            page_size: flags.page_size.or(self.page_size),
            shards: flags.shards.or(self.shards),
            policy: flags.policy.or(self.policy),
            mounts: flags.mounts.or(self.mounts),
            allow_file_roots: flags.allow_file_roots.or(self.allow_file_roots),
            listen: flags.listen.or(self.listen),
            members: flags.members.or(self.members),
            etcd: flags.etcd.or(self.etcd),
            etcd_user: flags.etcd_user.or(self.etcd_user),
            etcd_password_file: flags.etcd_password_file.or(self.etcd_password_file),
            etcd_ca: flags.etcd_ca.or(self.etcd_ca),
            etcd_cert: flags.etcd_cert.or(self.etcd_cert),
            etcd_key: flags.etcd_key.or(self.etcd_key),
            ring_mode: flags.ring_mode.or(self.ring_mode),
            lease_ttl: flags.lease_ttl.or(self.lease_ttl),
            tls_dir: flags.tls_dir.or(self.tls_dir),
            require_client_cert: flags.require_client_cert.or(self.require_client_cert),
            max_connections: flags.max_connections.or(self.max_connections),
            max_connections_per_ip: flags.max_connections_per_ip.or(self.max_connections_per_ip),
            max_partial_bytes: flags.max_partial_bytes.or(self.max_partial_bytes),
            request_stall_timeout: flags.request_stall_timeout.or(self.request_stall_timeout),
            retry_rate: flags.retry_rate.or(self.retry_rate),
            metadata_ttl: flags.metadata_ttl.or(self.metadata_ttl),
            replicas: flags.replicas.or(self.replicas),
            ufs_inflight: flags.ufs_inflight.or(self.ufs_inflight),
            ufs_threads: flags.ufs_threads.or(self.ufs_threads),
            admin: flags.admin.or(self.admin),
            pin: flags.pin.or(self.pin),
            rules: flags.rules.or(self.rules),
            write_replicas: flags.write_replicas.or(self.write_replicas),
            dirty_limit: flags.dirty_limit.or(self.dirty_limit),
            flush_parallel: flags.flush_parallel.or(self.flush_parallel),
            write_lease: flags.write_lease.or(self.write_lease),
            write_orphan_grace: flags.write_orphan_grace.or(self.write_orphan_grace),
            write_records_keep: flags.write_records_keep.or(self.write_records_keep),
            write_records_max: flags.write_records_max.or(self.write_records_max),
            hot_replicas: flags.hot_replicas.or(self.hot_replicas),
            hot_threshold: flags.hot_threshold.or(self.hot_threshold),
            hot_cool: flags.hot_cool.or(self.hot_cool),
            reformat: flags.reformat || self.reformat,
        }
    }

    /// The cache directories in force (the default: `$PAGESTORE_HOME/cache`).
    pub fn cache_dirs_or_default(&self) -> Vec<PathBuf> {
        match &self.cache_dirs {
            Some(d) if !d.is_empty() => d.clone(),
            _ => vec![home().join("cache")],
        }
    }

    /// Checks the settings and fills in the defaults. With no mounts this creates the embedded
    /// default's data directory (`$PAGESTORE_HOME/data`, with a README) if it is missing.
    pub fn resolve(self) -> Result<Resolved, SettingsError> {
        let limits = self.limits()?;
        let (etcd, etcd_options) = self.etcd_settings()?;
        let lease_ttl = match self.lease_ttl {
            None => etcd::DEFAULT_LEASE_TTL,
            Some(v) if (2.0..=3600.0).contains(&v) => Duration::from_secs_f64(v),
            Some(v) => return Err(invalid(format!("--lease-ttl {v}: use 2 to 3600 seconds"))),
        };
        let page_size = u32::try_from(self.page_size.map_or(4 << 20, |s| s.0))
            .map_err(|_| invalid("--page-size is at most 64M"))?;
        let max_request = page_size as usize + (64 << 10);
        if limits.max_partial_bytes < max_request {
            return Err(invalid(format!(
                "--max-partial-bytes {} cannot hold one whole request (page size + 64K = {} \
                 bytes): a write of a full page could never be received",
                limits.max_partial_bytes, max_request
            )));
        }
        let rules = Arc::new(Rules::new(self.rules.clone().unwrap_or_default())?);
        let mounts = match self.mounts.clone() {
            Some(m) if !m.is_empty() => m,
            _ => vec![default_mount()?],
        };
        let file_roots = file_roots(self.allow_file_roots.as_deref(), &mounts)?;
        let cache_size = self.cache_size.map_or(1 << 30, |s| s.0);
        let dirty_limit = self.dirty_limit.map_or(cache_size / 2, |s| s.0);
        if dirty_limit > cache_size {
            return Err(invalid(format!(
                "--dirty-limit {dirty_limit} is more than the cache ({cache_size} bytes): dirty pages live in the cache"
            )));
        }
        let write_lease = seconds(
            "--write-lease",
            self.write_lease,
            (5.0, 86400.0),
            Duration::from_secs(120),
        )?;
        let write_orphan_grace = seconds(
            "--write-orphan-grace",
            self.write_orphan_grace,
            (1.0, 86400.0),
            crate::writeback::WriteBackSettings::default().orphan_grace,
        )?;
        let write_records_keep = seconds(
            "--write-records-keep",
            self.write_records_keep,
            (1.0, 31_536_000.0),
            crate::writeback::WriteBackSettings::default().keep_records,
        )?;
        let write_records_max = match self.write_records_max {
            None => crate::writeback::WriteBackSettings::default().max_records,
            Some(0) => {
                return Err(invalid(
                    "--write-records-max 0: at least 1 (the records of files written through the cluster)",
                ))
            }
            Some(n) => n,
        };
        let spread = self.spread()?;
        let write_replicas = match self.write_replicas {
            None => 2,
            Some(0) => return Err(invalid("--write-replicas 0: at least 1")),
            Some(n) => n,
        };
        let listen = match self.listen {
            Some(a) => a,
            None => DEFAULT_LISTEN
                .parse()
                .map_err(|e| invalid(format!("{DEFAULT_LISTEN}: {e}")))?,
        };
        Ok(Resolved {
            cache_dirs: self.cache_dirs_or_default(),
            cache_size,
            memory_cache: self.memory_cache.map_or(0, |s| s.0),
            page_size,
            shards: self.shards.unwrap_or(0),
            mounts,
            file_roots,
            listen,
            members: self.members,
            etcd,
            etcd_options,
            ring_mode: self.ring_mode,
            lease_ttl,
            tls_dir: self.tls_dir,
            require_client_cert: self.require_client_cert,
            limits,
            metadata_ttl: Duration::from_secs_f64(self.metadata_ttl.unwrap_or(10.0).max(0.0)),
            replicas: self.replicas.unwrap_or(0),
            ufs_inflight: self.ufs_inflight.unwrap_or(16),
            ufs_threads: self.ufs_threads.unwrap_or(2).max(1),
            reformat: self.reformat,
            pin: self.pin.unwrap_or(false),
            admin: match self.admin.unwrap_or(AdminAddr::At(DEFAULT_ADMIN)) {
                AdminAddr::Off => None,
                AdminAddr::At(a) => Some(a),
            },
            policy: self.policy.unwrap_or(PolicyKind::Lru),
            rules,
            write_replicas,
            dirty_limit,
            flush_parallel: self
                .flush_parallel
                .unwrap_or(crate::writeback::WriteBackSettings::default().flush_parallel)
                .max(1),
            write_lease,
            write_orphan_grace,
            write_records_keep,
            write_records_max,
            spread,
        })
    }

    /// Hot-page replicas: the spread, the threshold and the cooling time, checked.
    fn spread(&self) -> Result<SpreadConfig, SettingsError> {
        let d = SpreadConfig::default();
        let spread = match self.hot_replicas {
            None => d.spread,
            Some(0) => {
                return Err(invalid(
                    "--hot-replicas 0: at least 1 (the owner alone: replicas off)",
                ))
            }
            Some(n) => n,
        };
        let threshold = match self.hot_threshold {
            None => d.threshold,
            Some(v) if v.is_finite() && v > 0.0 => v,
            Some(v) => {
                return Err(invalid(format!(
                    "--hot-threshold {v}: reads per second above 0"
                )))
            }
        };
        let cool = seconds("--hot-cool", self.hot_cool, (1.0, 86400.0), d.cool)?;
        Ok(SpreadConfig {
            spread,
            threshold,
            cool,
            ..d
        })
    }

    /// The endpoint limits (connections, request bytes, stall timeout, Retry rate).
    fn limits(&self) -> Result<pagestore_server::endpoint::Limits, SettingsError> {
        let mut l = pagestore_server::endpoint::Limits::default();
        if let Some(n) = self.max_connections {
            l.max_connections = n.max(1);
        }
        if let Some(n) = self.max_connections_per_ip {
            l.max_connections_per_ip = n.max(1);
        }
        if let Some(s) = self.max_partial_bytes {
            l.max_partial_bytes =
                usize::try_from(s.0).map_err(|_| invalid("--max-partial-bytes is too large"))?;
        }
        if let Some(v) = self.request_stall_timeout {
            if !(0.1..=3600.0).contains(&v) {
                return Err(invalid(format!(
                    "--request-stall-timeout {v}: use 0.1 to 3600 seconds"
                )));
            }
            l.request_stall_timeout = Duration::from_secs_f64(v);
        }
        if let Some(r) = self.retry_rate {
            l.retry_rate = r;
        }
        Ok(l)
    }

    /// The etcd URL (checked) and its options: each setting given wins over its
    /// `PAGESTORE_ETCD_*` variable.
    fn etcd_settings(&self) -> Result<(Option<String>, EtcdOptions), SettingsError> {
        if self.members.is_some() && self.etcd.is_some() {
            return Err(invalid(
                "--members and --etcd both name the members: choose one",
            ));
        }
        let Some(url) = &self.etcd else {
            if self.ring_mode.is_some() {
                return Err(invalid(
                    "--ring-mode needs --etcd (a member file is always a static ring)",
                ));
            }
            let given = [
                &self.etcd_password_file,
                &self.etcd_ca,
                &self.etcd_cert,
                &self.etcd_key,
            ]
            .iter()
            .any(|o| o.is_some());
            if given || self.etcd_user.is_some() {
                return Err(invalid(
                    "--etcd-user, --etcd-password-file, --etcd-ca, --etcd-cert and --etcd-key \
                     need --etcd",
                ));
            }
            return Ok((None, EtcdOptions::default()));
        };
        etcd::parse_etcd_url(url).map_err(|e| invalid(format!("--etcd: {e}")))?;
        let o = EtcdOptions::from_env_and_flags(
            self.etcd_user.clone(),
            self.etcd_password_file.as_deref(),
            [
                self.etcd_ca.clone(),
                self.etcd_cert.clone(),
                self.etcd_key.clone(),
            ],
        )?;
        Ok((Some(url.clone()), o))
    }
}

/// The admin endpoint's default address.
pub const DEFAULT_ADMIN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    7399,
));

/// The embedded default's mount: `$PAGESTORE_HOME/data` at `/data`, created (with a README to
/// read on a fresh machine) if missing.
fn default_mount() -> Result<(String, String), SettingsError> {
    let data = home().join("data");
    if !data.exists() {
        std::fs::create_dir_all(&data).map_err(|source| SettingsError::DataDir {
            path: data.clone(),
            source,
        })?;
        // Something to read on a fresh machine: `pagectl cat /data/README.txt`.
        let _ = std::fs::write(
            data.join("README.txt"),
            "This directory is mounted at /data by the default pagestored.\n\
             Put files here and read them through the cache: pagectl cat /data/NAME\n",
        );
    }
    Ok(("/data".to_string(), format!("file://{}", data.display())))
}

/// The `file://` allow-list: the given directories, or by default the directories of this
/// node's own `file://` mounts (those that exist; a missing one fails with its mount).
fn file_roots(
    given: Option<&[PathBuf]>,
    mounts: &[(String, String)],
) -> Result<FileRoots, SettingsError> {
    match given {
        Some(dirs) if !dirs.is_empty() => Ok(FileRoots::new(dirs)?),
        _ => {
            let own: Vec<PathBuf> = mounts
                .iter()
                .filter_map(|(_, u)| pagestore_mounts::ufs::local_dir(u))
                .filter(|d| d.is_dir())
                .collect();
            Ok(FileRoots::new(&own)?)
        }
    }
}

/// The settings a node runs with: checked, with every default filled in.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// Cache directories (at least one).
    pub cache_dirs: Vec<PathBuf>,
    /// Capacity over all directories.
    pub cache_size: u64,
    /// Page size.
    pub page_size: u32,
    /// Engine shards (0: one per CPU).
    pub shards: usize,
    /// This node's own mounts, with their credentials.
    pub mounts: Vec<(String, String)>,
    /// Where `file://` mounts may point.
    pub file_roots: FileRoots,
    /// QUIC base address.
    pub listen: SocketAddr,
    /// Static member file.
    pub members: Option<PathBuf>,
    /// etcd URL (checked).
    pub etcd: Option<String>,
    /// Credentials and TLS settings for etcd (settings over `PAGESTORE_ETCD_*`).
    pub etcd_options: EtcdOptions,
    /// The ring mode asked for (with etcd).
    pub ring_mode: Option<RingMode>,
    /// Membership lease TTL (with etcd).
    pub lease_ttl: Duration,
    /// TLS material (None: `<first cache dir>/tls`).
    pub tls_dir: Option<PathBuf>,
    /// None: required unless the node listens on a loopback address.
    pub require_client_cert: Option<bool>,
    /// What one peer may make the node hold.
    pub limits: pagestore_server::endpoint::Limits,
    /// How long file metadata and listings are cached.
    pub metadata_ttl: Duration,
    /// Replicas clients may try.
    pub replicas: u8,
    /// Bytes of the memory tier over all shards (0: off).
    pub memory_cache: u64,
    /// Under-storage requests in flight per shard.
    pub ufs_inflight: usize,
    /// Threads running under-storage requests.
    pub ufs_threads: usize,
    /// Rebuild cache files made with other settings.
    pub reformat: bool,
    /// Pin shards to CPUs.
    pub pin: bool,
    /// Admin endpoint address (None: off).
    pub admin: Option<SocketAddr>,
    /// Eviction policy.
    pub policy: PolicyKind,
    /// Cache rules (validated).
    pub rules: Arc<Rules>,
    /// Write replicas of files written through the cluster (at least 1).
    pub write_replicas: u8,
    /// Bytes of dirty pages the node holds.
    pub dirty_limit: u64,
    /// Files flushed at once.
    pub flush_parallel: usize,
    /// Silence after which an open file is sealed and flushed.
    pub write_lease: Duration,
    /// See [`Settings::write_orphan_grace`].
    pub write_orphan_grace: Duration,
    /// How long settled write-back records are kept.
    pub write_records_keep: Duration,
    /// Write-back records kept, at most.
    pub write_records_max: usize,
    /// Hot-page replicas.
    pub spread: SpreadConfig,
}
