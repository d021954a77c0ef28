//! The under storage as a node's shards see it once write-back is on: the mount table, with
//! the records of files, directories and deletions made through the cluster laid over it.
//!
//! - `stat` of a path a record names answers the record (a file written through the cluster
//!   at its write-back version, a directory, or not found for a deletion); a flushed file is
//!   answered from its record only while the store still holds the object the flush wrote
//!   (someone who rewrote it in the store behind the cluster's back is seen as for any object).
//! - `list` merges the store's listing with the records beneath the directory.
//! - `read` of a page of a write-back version that a shard does not hold is served from the
//!   store only once the version is flushed (at the store's version of it); before, it is an
//!   `Unflushed` error: the client asks the page's other write members.

use std::{ops::Range, sync::Arc};

use bytes::Bytes;
use pagestore_mounts::ufs::UfsSource;
use pagestore_protocol::{
    frame::{DirEntry, ErrorCode, FileId, FileRef, MountEntry, PathKind, RecordEntry, RecordState},
    ring,
    source::{Source, SourceError, SourceFuture},
    writeback::{is_wb_tag, WriteBack},
};

use super::{
    records::{version_id, Known},
    WriteBackNode,
};

/// The mount table with the write-back records over it.
pub struct WbSource {
    ufs: Arc<UfsSource>,
    wb: Arc<WriteBackNode>,
}

impl WbSource {
    /// `ufs` seen through `wb`'s records.
    pub fn new(ufs: Arc<UfsSource>, wb: Arc<WriteBackNode>) -> WbSource {
        WbSource { ufs, wb }
    }
}

/// What a file record answers to a stat.
fn file_kind(path: &str, entry: &RecordEntry) -> Option<PathKind> {
    let RecordEntry::File {
        version_tag,
        size,
        mtime_ns,
        state,
        store_tag,
        transient,
        ..
    } = entry
    else {
        return None;
    };
    Some(PathKind::File {
        size: *size,
        version_tag: version_tag.clone(),
        file_id: FileId::from_u128(ring::file_id(path, version_tag)),
        mtime_ns: *mtime_ns,
        state: WriteBackNode::file_state(*state, *transient),
        store_tag: store_tag.clone(),
    })
}

fn not_found(path: &str) -> SourceError {
    SourceError::new(
        ErrorCode::NotFound,
        format!("{path}: no such file or directory"),
    )
}

impl WbSource {
    /// The error for a stat or listing of `path` while this node is still taking its peers'
    /// records after its start, if `path` is under a mount written through the cluster (its
    /// records may miss what the cluster acknowledged while the node was down; the client asks
    /// the path's next member). `None` when the node can answer.
    fn catching_up(&self, path: &str) -> Option<SourceError> {
        if !self.wb.catching_up() || !self.ufs.table().write_policy(path).is_cached() {
            return None;
        }
        Some(SourceError::new(
            ErrorCode::Unavailable,
            format!(
                "{path}: this node is still taking its peers' records after its start (it may \
                 have missed changes while it was down)"
            ),
        ))
    }

    /// The node, when a stat or listing of `path` takes its peers' records first: `path` is
    /// under a `back` or `transient` mount, the node has taken its peers' records at start
    /// (before, it answers neither), and some peers must be asked
    /// ([`WriteBackNode::peers_for_reads`]).
    fn peers_to_catch_up(&self, path: &str) -> Option<Arc<WriteBackNode>> {
        (self.wb.peers_for_reads() > 0
            && !self.wb.catching_up()
            && self.ufs.table().write_policy(path).is_cached())
        .then(|| self.wb.clone())
    }
}

impl Source for WbSource {
    fn read_from_owner(&self, file: &FileRef, page: u64) -> SourceFuture<Bytes> {
        let Some(client) = self.wb.peers().cloned() else {
            return Box::pin(async {
                Err(SourceError::new(
                    ErrorCode::Unavailable,
                    "this node is not connected to its peers yet",
                ))
            });
        };
        let file = file.clone();
        Box::pin(async move {
            client.read_from_owner(&file, page).await.map_err(|e| {
                SourceError::new(ErrorCode::Unavailable, format!("the page's owner: {e}"))
            })
        })
    }

    fn read(&self, file: &FileRef, range: Range<u64>) -> SourceFuture<Bytes> {
        if !is_wb_tag(&file.version_tag) {
            return self.ufs.read(file, range);
        }
        let found = self
            .wb
            .table()
            .by_file(version_id(&file.version_tag))
            .cloned();
        match found {
            Some(rec) => match &rec.entry {
                RecordEntry::File {
                    state: RecordState::Clean,
                    store_tag,
                    size,
                    ..
                } if !store_tag.is_empty() => {
                    let stored = FileRef {
                        file_id: FileId::from_u128(ring::file_id(&rec.path, store_tag)),
                        mount: file.mount.clone(),
                        path: rec.path.clone(),
                        version_tag: store_tag.clone(),
                        size: *size,
                    };
                    self.ufs.read(&stored, range)
                }
                _ => unflushed(&file.path),
            },
            None => unflushed(&file.path),
        }
    }

    fn stat(&self, path: &str) -> SourceFuture<PathKind> {
        if let Some(e) = self.catching_up(path) {
            return Box::pin(async move { Err(e) });
        }
        let known = match self.wb.table().known(path) {
            Known::Record(r) => Some(r.clone()),
            Known::Implied => return Box::pin(async { Ok(PathKind::DIR) }),
            Known::Unknown => None,
        };
        let Some(rec) = known else {
            return self.ufs.stat(path);
        };
        let path = path.to_string();
        let store = self.ufs.stat(&path);
        Box::pin(async move {
            match &rec.entry {
                RecordEntry::Dir { mtime_ns } => Ok(PathKind::Dir {
                    mtime_ns: *mtime_ns,
                }),
                RecordEntry::Deleted { .. } => Err(not_found(&path)),
                RecordEntry::File {
                    state: RecordState::Clean,
                    store_tag,
                    ..
                } => {
                    // The flushed object, as long as the store still holds it (and while
                    // the store cannot be asked).
                    match store.await {
                        Ok(PathKind::File {
                            version_tag: now, ..
                        }) if &now == store_tag => {
                            file_kind(&path, &rec.entry).ok_or_else(|| not_found(&path))
                        }
                        Err(e) if e.code != ErrorCode::NotFound => {
                            file_kind(&path, &rec.entry).ok_or_else(|| not_found(&path))
                        }
                        other => other,
                    }
                }
                entry => file_kind(&path, entry).ok_or_else(|| not_found(&path)),
            }
        })
    }

    /// The store's head where no record lies beneath the directory (records are merged into
    /// whole listings only).
    fn list_head(&self, path: &str, max: usize) -> Option<SourceFuture<(Vec<DirEntry>, bool)>> {
        let dir = path.trim_end_matches('/');
        let dir = if dir.is_empty() { "/" } else { dir };
        if self.catching_up(dir).is_some() {
            // The whole listing answers it.
            return None;
        }
        let t = self.wb.table();
        let (records, implied) = t.children(dir);
        if !records.is_empty() || !implied.is_empty() || !matches!(t.known(dir), Known::Unknown) {
            return None;
        }
        drop(t);
        self.ufs.list_head(dir, max)
    }

    fn list(&self, path: &str) -> SourceFuture<Vec<DirEntry>> {
        let dir = if path.trim_end_matches('/').is_empty() {
            "/".to_string()
        } else {
            path.trim_end_matches('/').to_string()
        };
        if let Some(e) = self.catching_up(&dir) {
            return Box::pin(async move { Err(e) });
        }
        let (records, implied, is_dir) = {
            let t = self.wb.table();
            let (r, i) = t.children(&dir);
            let records: Vec<(String, RecordEntry)> = r
                .into_iter()
                .map(|(n, rec)| (n.to_string(), rec.entry.clone()))
                .collect();
            let implied: Vec<String> = i.into_iter().map(str::to_string).collect();
            let is_dir = !matches!(t.known(&dir), Known::Unknown)
                && !matches!(
                    t.known(&dir),
                    Known::Record(r) if !matches!(r.entry, RecordEntry::Dir { .. })
                );
            (records, implied, is_dir)
        };
        let store = self.ufs.list(&dir);
        if records.is_empty() && implied.is_empty() && !is_dir {
            return store;
        }
        Box::pin(async move {
            let mut entries = match store.await {
                Ok(v) => v,
                Err(e) if e.code == ErrorCode::NotFound => Vec::new(),
                Err(e) => return Err(e),
            };
            let mut by_name: std::collections::BTreeMap<String, DirEntry> =
                entries.drain(..).map(|e| (e.name.clone(), e)).collect();
            for (name, entry) in records {
                match &entry {
                    RecordEntry::File {
                        version_tag,
                        size,
                        mtime_ns,
                        ..
                    } => {
                        by_name.insert(
                            name.clone(),
                            DirEntry {
                                name,
                                is_dir: false,
                                size: *size,
                                version_tag: version_tag.clone(),
                                mtime_ns: *mtime_ns,
                            },
                        );
                    }
                    RecordEntry::Dir { mtime_ns } => {
                        let mut e = DirEntry::dir(name.clone());
                        e.mtime_ns = *mtime_ns;
                        by_name.insert(name, e);
                    }
                    RecordEntry::Deleted { .. } => {
                        // Gone, unless it is still a directory (of the store, or by records
                        // beneath it).
                        let keep_dir = by_name.get(&name).is_some_and(|e| e.is_dir);
                        if !keep_dir {
                            by_name.remove(&name);
                        }
                    }
                }
            }
            for name in implied {
                by_name
                    .entry(name.clone())
                    .or_insert_with(|| DirEntry::dir(name));
            }
            Ok(by_name.into_values().collect())
        })
    }

    /// A path of a `back` or `transient` mount: the records of it that enough peers hold
    /// (once this node has taken its peers' records at start; before, it answers no stat).
    fn catch_up(&self, path: &str) -> Option<SourceFuture<()>> {
        let (wb, path) = (self.peers_to_catch_up(path)?, path.to_string());
        Some(Box::pin(async move {
            wb.catch_up_for_read(&path).await;
            Ok(())
        }))
    }

    /// A directory of a `back` or `transient` mount: the records of its entries that enough
    /// peers hold, as for a stat.
    fn catch_up_listing(&self, dir: &str) -> Option<SourceFuture<()>> {
        let (wb, dir) = (self.peers_to_catch_up(dir)?, dir.to_string());
        Some(Box::pin(async move {
            wb.catch_up_for_listing(&dir).await;
            Ok(())
        }))
    }

    fn mounts(&self) -> Vec<MountEntry> {
        self.ufs.mounts()
    }
}

fn unflushed(path: &str) -> SourceFuture<Bytes> {
    let message = format!(
        "{path}: this member does not hold the page, and the file is not in the under storage \
         yet; ask its other write members"
    );
    Box::pin(async move { Err(SourceError::new(ErrorCode::Unflushed, message)) })
}
