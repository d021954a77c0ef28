//! The engine's error types: [`StartError`] for what stops an engine from starting (settings,
//! the machine, the cache directory), [`EngineError`] for what a single request meets while the
//! engine runs. A caller serving requests matches `EngineError` exhaustively: every case in it
//! can happen to a request, and none of them is a start-up problem.

use std::{io, path::PathBuf};

/// Why an engine (or its configuration, such as a rule table) cannot start. Each message tells
/// an operator what to change.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid; the message says which setting and why.
    #[error("invalid engine configuration: {0}")]
    Config(String),
    /// io_uring cannot be used on this machine (disabled by sysctl, filtered by seccomp, too old).
    #[error("io_uring is unavailable: {0}")]
    IoUringUnavailable(String),
    /// The cache directory's file system refuses O_DIRECT (tmpfs, some FUSE or network mounts).
    #[error(
        "{}: the file system does not support O_DIRECT ({source}); put the cache directory on a \
         local disk file system such as ext4 or xfs",
        path.display()
    )]
    DirectIoUnsupported {
        /// The cache file that could not be opened with O_DIRECT.
        path: PathBuf,
        /// What the kernel said.
        source: io::Error,
    },
    /// The configured capacity does not fit on the file system.
    #[error(
        "{}: not enough space for the cache: need {needed} bytes, {available} available; lower \
         the cache size (pagestored --cache-size, or cache_size in its configuration file) or \
         free space",
        path.display()
    )]
    NoSpace {
        /// The cache directory.
        path: PathBuf,
        /// Bytes the cache files need in this directory.
        needed: u64,
        /// Bytes the file system has free (plus what existing cache files already hold).
        available: u64,
    },
    /// Another process holds the cache directory.
    #[error(
        "{}: the cache directory is in use by another process (stop it, or use another \
         directory)",
        path.display()
    )]
    CacheInUse {
        /// The lock file.
        path: PathBuf,
    },
    /// An existing cache file was made with other settings, or its superblock is damaged.
    #[error(
        "{}: existing cache file cannot be used: {reason}; delete it or start with reformat \
         enabled to discard its contents",
        path.display()
    )]
    Incompatible {
        /// The cache file.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
    /// An I/O error while doing `op` (creating, opening, recovering or formatting cache files).
    #[error("{op}{}: {source}", path_or_nothing(path))]
    Io {
        /// What the engine was doing.
        op: &'static str,
        /// The file involved, if any.
        path: Option<PathBuf>,
        /// The underlying error.
        source: io::Error,
    },
    /// A shard's thread ended while the engine started; the error it ended with.
    #[error("a shard failed while starting: {0}")]
    Shard(#[source] EngineError),
}

/// What a request met while the engine runs. The shard keeps serving other requests.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// An I/O error while doing `op`.
    #[error("{op}{}: {source}", path_or_nothing(path))]
    Io {
        /// What the engine was doing.
        op: &'static str,
        /// The file involved, if any.
        path: Option<PathBuf>,
        /// The underlying error.
        source: io::Error,
    },
    /// Every slot of the shard is pinned, being written or being read: nothing can be evicted.
    #[error("cache shard is full: every page is pinned or in use, nothing can be evicted")]
    CacheFull,
    /// The page's rule is at its quota and none of its pages can be evicted (all pinned by
    /// request, being written or being read); the page was not stored.
    #[error(
        "rule {rule} is at its quota and none of its pages can be evicted (pinned, being written \
         or being read)"
    )]
    QuotaFull {
        /// The rule's prefix.
        rule: String,
    },
    /// A read asked for bytes starting past the end of the page.
    #[error("read offset {offset} is past the end of the page ({page_len} bytes)")]
    BadRange {
        /// Requested offset inside the page.
        offset: u32,
        /// Length of the stored page.
        page_len: u32,
    },
    /// A put carried more bytes than the page size.
    #[error("page of {len} bytes exceeds the page size {page_size}")]
    PageTooLarge {
        /// Bytes given.
        len: usize,
        /// The cache's page size.
        page_size: u32,
    },
    /// `put_buffer` was told the page is longer than its buffer.
    #[error("page length {len} exceeds its buffer of {capacity} bytes")]
    BufferTooShort {
        /// Page length given.
        len: usize,
        /// Bytes in the buffer.
        capacity: usize,
    },
    /// The shard has shut down (or its thread died); the request was not executed.
    #[error("the shard has shut down")]
    ShardGone,
    /// A dirty page would take the shard past its dirty limit: nothing was stored. The
    /// write can be tried again once flushes have made room.
    #[error(
        "the shard holds {dirty} bytes of dirty pages and may hold at most {limit}: wait for flushes to make room"
    )]
    DirtyFull {
        /// Bytes of dirty pages the shard holds.
        dirty: u64,
        /// The shard's dirty limit.
        limit: u64,
    },
}

/// `" <path>"` for messages: the op comes first, then the file if there is one.
fn path_or_nothing(path: &Option<PathBuf>) -> String {
    path.as_ref()
        .map_or_else(String::new, |p| format!(" {}", p.display()))
}

impl EngineError {
    pub(crate) fn io(op: &'static str, path: Option<PathBuf>, source: io::Error) -> Self {
        EngineError::Io { op, path, source }
    }

    /// The `io::ErrorKind` behind an I/O error, if this is one.
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            EngineError::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }
}

impl StartError {
    pub(crate) fn io(op: &'static str, path: Option<PathBuf>, source: io::Error) -> Self {
        StartError::Io { op, path, source }
    }

    /// The `io::ErrorKind` behind an I/O error, if this is one.
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            StartError::Io { source, .. } | StartError::DirectIoUnsupported { source, .. } => {
                Some(source.kind())
            }
            StartError::Shard(e) => e.io_kind(),
            _ => None,
        }
    }
}

impl From<EngineError> for StartError {
    /// An I/O error stays one; anything else a shard ended with is reported as such.
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Io { op, path, source } => StartError::Io { op, path, source },
            e => StartError::Shard(e),
        }
    }
}

/// Shorthand for engine results.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
