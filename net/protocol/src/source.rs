//! The under storage as a node sees it: the [`Source`] seam, written in wire types, that a
//! node's shards load misses through. `pagestore-mounts` implements it over the mount table;
//! tests implement it with fault injection. Runtime-free: implementations return `Send` futures
//! that the node runs on a runtime of its choosing.

use std::{future::Future, ops::Range, pin::Pin};

use bytes::Bytes;

use crate::frame::{DirEntry, ErrorCode, FileRef, MountEntry, PathKind};

/// Why the under storage could not answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceError {
    /// The category sent to clients (`NotFound`, `Changed`, `BadRequest`, `Io`, `Unavailable`).
    pub code: ErrorCode,
    /// What went wrong, for people.
    pub message: String,
}

impl SourceError {
    /// An error of category `code`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> SourceError {
        SourceError {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for SourceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

impl std::error::Error for SourceError {}

/// A `Send` future of the under storage.
pub type SourceFuture<T> = Pin<Box<dyn Future<Output = Result<T, SourceError>> + Send>>;

/// The under storage as a shard sees it. Implementations must be cheap to call from any thread;
/// the futures they return run on the node's tokio runtime.
pub trait Source: Send + Sync + 'static {
    /// Reads `range` of `file` at exactly `file.version_tag` (fewer bytes only at the end of the
    /// object); `Changed` if the object now has another version.
    fn read(&self, file: &FileRef, range: Range<u64>) -> SourceFuture<Bytes>;
    /// What `path` names.
    fn stat(&self, path: &str) -> SourceFuture<PathKind>;
    /// Every entry of directory `path`, sorted by name.
    fn list(&self, path: &str) -> SourceFuture<Vec<DirEntry>>;
    /// The mount table, credentials removed.
    fn mounts(&self) -> Vec<MountEntry>;
}

/// The version number pages loaded at `version_tag` are stored with (`hash64` of the tag).
pub fn page_version(version_tag: &str) -> u64 {
    crate::ring::hash64(version_tag.as_bytes())
}
