//! The engine's error type.

use std::{fmt, io, path::PathBuf};

/// Everything that can go wrong in the engine. Start-up problems carry enough context to tell an
/// operator what to change; per-request problems leave the shard serving other requests.
#[derive(Debug)]
pub enum EngineError {
    /// The configuration is invalid; the message says which setting and why.
    Config(String),
    /// io_uring cannot be used on this machine (disabled by sysctl, filtered by seccomp, too old).
    IoUringUnavailable(String),
    /// The cache directory's file system refuses O_DIRECT (tmpfs, some FUSE or network mounts).
    DirectIoUnsupported {
        /// The cache file that could not be opened with O_DIRECT.
        path: PathBuf,
        /// What the kernel said.
        source: io::Error,
    },
    /// The configured capacity does not fit on the file system.
    NoSpace {
        /// The cache directory.
        path: PathBuf,
        /// Bytes the cache files need in this directory.
        needed: u64,
        /// Bytes the file system has free (plus what existing cache files already hold).
        available: u64,
    },
    /// Another process holds the cache directory.
    CacheInUse {
        /// The lock file.
        path: PathBuf,
    },
    /// An existing cache file was made with other settings, or its superblock is damaged.
    Incompatible {
        /// The cache file.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
    /// An I/O error while doing `op`.
    Io {
        /// What the engine was doing.
        op: &'static str,
        /// The file involved, if any.
        path: Option<PathBuf>,
        /// The underlying error.
        source: io::Error,
    },
    /// Every slot of the shard is pinned, being written or being read: nothing can be evicted.
    CacheFull,
    /// The page's rule is at its quota and none of its pages can be evicted (all pinned by
    /// request, being written or being read); the page was not stored.
    QuotaFull {
        /// The rule's prefix.
        rule: String,
    },
    /// A read asked for bytes starting past the end of the page.
    BadRange {
        /// Requested offset inside the page.
        offset: u32,
        /// Length of the stored page.
        page_len: u32,
    },
    /// A put carried more bytes than the page size.
    PageTooLarge {
        /// Bytes given.
        len: usize,
        /// The cache's page size.
        page_size: u32,
    },
    /// `put_buffer` was told the page is longer than its buffer.
    BufferTooShort {
        /// Page length given.
        len: usize,
        /// Bytes in the buffer.
        capacity: usize,
    },
    /// The shard has shut down (or its thread died); the request was not executed.
    ShardGone,
}

impl EngineError {
    pub(crate) fn io(op: &'static str, path: Option<PathBuf>, source: io::Error) -> Self {
        EngineError::Io { op, path, source }
    }

    /// The `io::ErrorKind` behind an I/O error, if this is one.
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            EngineError::Io { source, .. } | EngineError::DirectIoUnsupported { source, .. } => {
                Some(source.kind())
            }
            _ => None,
        }
    }
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::Config(m) => write!(f, "invalid engine configuration: {m}"),
            EngineError::IoUringUnavailable(m) => write!(f, "io_uring is unavailable: {m}"),
            EngineError::DirectIoUnsupported { path, source } => write!(
                f,
                "{}: the file system does not support O_DIRECT ({source}); put the cache \
                 directory on a local disk file system such as ext4 or xfs",
                path.display()
            ),
            EngineError::NoSpace {
                path,
                needed,
                available,
            } => write!(
                f,
                "{}: not enough space for the cache: need {needed} bytes, {available} available; \
                 lower the cache size or free space",
                path.display()
            ),
            EngineError::CacheInUse { path } => write!(
                f,
                "{}: the cache directory is in use by another process (stop it, or use another \
                 directory)",
                path.display()
            ),
            EngineError::Incompatible { path, reason } => write!(
                f,
                "{}: existing cache file cannot be used: {reason}; delete it or start with \
                 reformat enabled to discard its contents",
                path.display()
            ),
            EngineError::Io { op, path, source } => match path {
                Some(p) => write!(f, "{op} {}: {source}", p.display()),
                None => write!(f, "{op}: {source}"),
            },
            EngineError::CacheFull => write!(
                f,
                "cache shard is full: every page is pinned or in use, nothing can be evicted"
            ),
            EngineError::QuotaFull { rule } => write!(
                f,
                "rule {rule} is at its quota and none of its pages can be evicted (pinned, being \
                 written or being read)"
            ),
            EngineError::BadRange { offset, page_len } => {
                write!(
                    f,
                    "read offset {offset} is past the end of the page ({page_len} bytes)"
                )
            }
            EngineError::PageTooLarge { len, page_size } => {
                write!(f, "page of {len} bytes exceeds the page size {page_size}")
            }
            EngineError::BufferTooShort { len, capacity } => {
                write!(
                    f,
                    "page length {len} exceeds its buffer of {capacity} bytes"
                )
            }
            EngineError::ShardGone => write!(f, "the shard has shut down"),
        }
    }
}

impl std::error::Error for EngineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EngineError::Io { source, .. } | EngineError::DirectIoUnsupported { source, .. } => {
                Some(source)
            }
            _ => None,
        }
    }
}

/// Shorthand for engine results.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
