//! Files open for writing, as pagefs keeps them.
//!
//! One [`WriteFile`] per inode being written through this mount, shared by every descriptor
//! open for writing on it (so two descriptors of one process write one file, as on a local
//! file system), kept until the last of them is released. What it holds depends on how the
//! path's mount takes writes ([`Writes`]):
//!
//! - `write=back` or `write=transient`: a [`Writer`] of the cluster. Its pages are filled in
//!   memory and sent whole to their write replicas; fsync and close(2) commit the file at its
//!   size (durable on the replicas, visible to every reader); the release of the last
//!   descriptor closes the version for good (the cluster may then flush it to the store).
//! - `write=through` (with the store reachable from this machine): a staging file on local
//!   disk, sent whole to the store at fsync and close(2) (in parts of [`PART`] bytes), as a
//!   `Client::put` does.
//!
//! The first error a file meets sticks: every later write, fsync and close(2) answers it, and
//! nothing more is committed (a later flush could otherwise commit a page that was lost).

use std::{
    fs::File,
    os::unix::fs::FileExt,
    path::Path,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, Weak,
    },
    time::Instant,
};

use bytes::Bytes;
use fuser::Errno;
use pagestore_client::{
    ufs::{ObjectInfo, PartUploads},
    writer::{WriteOptions, KEEPALIVE},
    Client, Error, Writer,
};
use tracing::{info, warn};

use crate::{errno, lock};

/// How a path takes writes from this mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Writes {
    /// Through the cluster (a `write=back` or `write=transient` mount).
    Cluster,
    /// Staged here and sent to the under storage at fsync and close (a `write=through` mount
    /// whose store this machine can write).
    Store,
    /// Not at all (EROFS).
    No,
}

/// A staged file up to this size goes to the store in one request; a larger one in parts of
/// this size (two in flight), so that memory stays bounded whatever the file's size.
pub(crate) const PART: u64 = 16 << 20;

/// How an open treats what the file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Start {
    /// A new file (create): empty, visible at once.
    Create,
    /// `O_TRUNC`: empty, visible at once.
    Truncate,
    /// Keep the content (open for writing without `O_TRUNC`).
    Keep,
}

pub(crate) enum Body {
    /// Not opened yet, or its opening failed: the next opener opens it.
    Unopened,
    /// Written through the cluster.
    Cluster(Box<Writer>),
    /// Staged in a local file (unlinked: it goes when the last reference does).
    Staged(File),
    /// Closed through the cluster: what a stat now answers (reads go to the cluster).
    Closed(ObjectInfo),
    /// Its writer failed and was dropped.
    Broken,
}

pub(crate) struct WriteState {
    pub body: Body,
    /// The staged file's size (a cluster writer keeps its own).
    pub staged_size: u64,
    /// Changed since the last commit or upload (or never committed).
    pub dirty: bool,
    /// The first error: every later write, fsync and close answers it.
    pub failed: Option<Errno>,
    /// Unlinked while open: nothing more goes to the store.
    pub unlinked: bool,
    /// The last write, commit or upload (for the keep-alive).
    pub active: Instant,
    /// Counts the writers started on this file (a keep-alive serves one).
    pub generation: u64,
}

/// A file being written through this mount (see the module docs).
pub(crate) struct WriteFile {
    pub ino: u64,
    pub how: Writes,
    /// Where it is now (a rename moves it).
    pub path: Mutex<Arc<str>>,
    /// Descriptors open for writing on it (changed under the table of writers' lock).
    pub handles: AtomicUsize,
    pub state: tokio::sync::Mutex<WriteState>,
    /// Size and modification time (ns) as the writer sees them, for getattr without waiting
    /// for a write in progress.
    pub attrs: Mutex<(u64, i64)>,
}

fn io_errno(op: &str, path: &str, e: &std::io::Error) -> Errno {
    warn!("{op} {path}: {e}");
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

impl WriteFile {
    pub(crate) fn new(ino: u64, path: Arc<str>, how: Writes) -> WriteFile {
        WriteFile {
            ino,
            how,
            path: Mutex::new(path),
            handles: AtomicUsize::new(0),
            state: tokio::sync::Mutex::new(WriteState {
                body: Body::Unopened,
                staged_size: 0,
                dirty: false,
                failed: None,
                unlinked: false,
                active: Instant::now(),
                generation: 0,
            }),
            attrs: Mutex::new((0, pagestore_protocol::writeback::unix_ns())),
        }
    }

    pub(crate) fn path(&self) -> Arc<str> {
        lock(&self.path).clone()
    }

    pub(crate) fn handles(&self) -> usize {
        self.handles.load(Ordering::Acquire)
    }

    fn set_attrs(&self, size: u64) {
        *lock(&self.attrs) = (size, pagestore_protocol::writeback::unix_ns());
    }

    /// Opens the file for one more descriptor: the first opener (or one after a close or a
    /// failure) starts the writer; a later `O_TRUNC` empties it.
    pub(crate) async fn start(
        self: &Arc<Self>,
        client: &Arc<Client>,
        staging: &Path,
        how: Start,
    ) -> Result<(), Errno> {
        let mut st = self.state.lock().await;
        let fresh = matches!(st.body, Body::Unopened | Body::Closed(_) | Body::Broken);
        if !fresh {
            if let Some(e) = st.failed {
                return Err(e);
            }
            if how != Start::Keep {
                self.truncate_locked(&mut st, 0).await?;
            }
            return Ok(());
        }
        if st.failed.is_some() && self.handles() > 1 {
            // Other descriptors still hold the failed writer.
            return Err(st.failed.unwrap_or(Errno::EIO));
        }
        let path = self.path();
        let (body, size, dirty) = match self.how {
            Writes::Cluster => {
                let w = match how {
                    Start::Create | Start::Truncate => {
                        let options = WriteOptions {
                            visible_at_open: true,
                            ..spilling(staging)
                        };
                        client.create(&path, options).await
                    }
                    Start::Keep => client.open_write(&path, spilling(staging)).await,
                }
                .map_err(|e| errno("open", &path, &e))?;
                let size = w.size();
                // A copy of the content is not committed yet.
                let dirty = how == Start::Keep;
                tokio::spawn(keepalive(Arc::downgrade(self), st.generation + 1));
                (Body::Cluster(Box::new(w)), size, dirty)
            }
            Writes::Store => {
                let file = staging_file(staging).map_err(|e| io_errno("open", &path, &e))?;
                let (size, dirty) = match how {
                    Start::Create | Start::Truncate => (0, true),
                    Start::Keep => match client.stat(&path).await {
                        Ok(info) => {
                            copy_into(client, &info, &file).await?;
                            (info.size, false)
                        }
                        Err(Error::NotFound(_)) => (0, true),
                        Err(e) => return Err(errno("open", &path, &e)),
                    },
                };
                (Body::Staged(file), size, dirty)
            }
            Writes::No => return Err(Errno::EROFS),
        };
        st.body = body;
        st.staged_size = size;
        st.dirty = dirty;
        st.failed = None;
        st.unlinked = false;
        st.active = Instant::now();
        st.generation += 1;
        self.set_attrs(size);
        Ok(())
    }

    /// Writes `data` at `offset` (at the end with `append`); the file's size after it.
    pub(crate) async fn write(&self, offset: u64, data: &[u8], append: bool) -> Result<u64, Errno> {
        let mut st = self.state.lock().await;
        if let Some(e) = st.failed {
            return Err(e);
        }
        let path = self.path();
        let staged_size = st.staged_size;
        let r = match &mut st.body {
            Body::Cluster(w) => {
                let at = if append { w.size() } else { offset };
                match w.write_at(at, data).await {
                    Ok(()) => Ok(w.size()),
                    Err(e) => Err(errno("write", &path, &e)),
                }
            }
            Body::Staged(f) => {
                let at = if append { staged_size } else { offset };
                match tokio::task::block_in_place(|| f.write_all_at(data, at)) {
                    Ok(()) => Ok(staged_size.max(at + data.len() as u64)),
                    Err(e) => Err(io_errno("write", &path, &e)),
                }
            }
            _ => Err(Errno::EBADF),
        };
        match r {
            Ok(size) => {
                st.staged_size = size;
                st.dirty = true;
                st.active = Instant::now();
                self.set_attrs(size);
            }
            Err(e) => st.failed = Some(e),
        }
        r
    }

    /// truncate(2) and utimensat(2) through this writer while it is open: the new size, and the
    /// modification time committed with the next fsync or close (a file of a `write=through`
    /// mount takes the store's time when it is sent: the time is shown while it is open here
    /// only). `None` when the writer is no longer open (its last close ran meanwhile, as when
    /// `tar` sets a file's time just after closing it): the caller changes the path instead.
    pub(crate) async fn change_if_open(
        &self,
        size: Option<u64>,
        mtime_ns: Option<i64>,
    ) -> Option<Result<(), Errno>> {
        let mut st = self.state.lock().await;
        if let Some(e) = st.failed {
            return Some(Err(e));
        }
        if !matches!(st.body, Body::Cluster(_) | Body::Staged(_)) {
            return None;
        }
        if let Some(size) = size {
            if let Err(e) = self.truncate_locked(&mut st, size).await {
                return Some(Err(e));
            }
        }
        if let Some(t) = mtime_ns {
            if let Body::Cluster(w) = &mut st.body {
                w.set_mtime(t);
                st.dirty = true;
            }
            lock(&self.attrs).1 = t;
        }
        Some(Ok(()))
    }

    /// Cuts or extends the file to `size` bytes.
    pub(crate) async fn truncate(&self, size: u64) -> Result<(), Errno> {
        let mut st = self.state.lock().await;
        if let Some(e) = st.failed {
            return Err(e);
        }
        self.truncate_locked(&mut st, size).await
    }

    async fn truncate_locked(&self, st: &mut WriteState, size: u64) -> Result<(), Errno> {
        let path = self.path();
        let r = match &mut st.body {
            Body::Cluster(w) => w
                .set_len(size)
                .await
                .map_err(|e| errno("truncate", &path, &e)),
            Body::Staged(f) => tokio::task::block_in_place(|| f.set_len(size))
                .map_err(|e| io_errno("truncate", &path, &e)),
            _ => Err(Errno::EBADF),
        };
        match r {
            Ok(()) => {
                st.staged_size = size;
                st.dirty = true;
                st.active = Instant::now();
                self.set_attrs(size);
            }
            Err(e) => st.failed = Some(e),
        }
        r
    }

    /// fsync, and close(2) of a descriptor: everything written so far is durable and visible
    /// (committed through the cluster, or sent to the store). Returns the sticky error, if any.
    /// `Some(info)`: what a stat of the path now answers, where an upload says.
    pub(crate) async fn sync(&self, client: &Arc<Client>) -> Result<Option<ObjectInfo>, Errno> {
        let mut st = self.state.lock().await;
        if let Some(e) = st.failed {
            return Err(e);
        }
        if !st.dirty {
            return Ok(None);
        }
        let path = self.path();
        let (unlinked, size) = (st.unlinked, st.staged_size);
        let r = match &mut st.body {
            Body::Cluster(w) => w
                .flush()
                .await
                .map(|()| None)
                .map_err(|e| errno("fsync", &path, &e)),
            Body::Staged(_) if unlinked => Ok(None),
            Body::Staged(f) => upload(client, &path, f, size)
                .await
                .map(Some)
                .map_err(|e| errno("fsync", &path, &e)),
            _ => Ok(None),
        };
        match &r {
            Ok(_) => {
                st.dirty = false;
                st.active = Instant::now();
            }
            Err(e) => st.failed = Some(*e),
        }
        r
    }

    /// The last descriptor was released: closes the version for good (a cluster writer), or
    /// sends what is left to the store. Does nothing if the file was opened again meanwhile.
    /// Returns what a stat of the path now answers, if known.
    pub(crate) async fn close(&self, client: &Arc<Client>) -> Option<ObjectInfo> {
        let mut st = self.state.lock().await;
        if self.handles() > 0 {
            return None;
        }
        let path = self.path();
        let body = std::mem::replace(&mut st.body, Body::Unopened);
        let (body, info) = match body {
            Body::Cluster(w) if st.failed.is_none() => match w.close().await {
                Ok(info) => (Body::Closed(info.clone()), Some(info)),
                Err(e) => {
                    st.failed = Some(errno("close", &path, &e));
                    warn!(
                        "close {path}: {e}; the file keeps what its last fsync or close(2) \
                         committed (the cluster seals it after its lease)"
                    );
                    (Body::Broken, None)
                }
            },
            Body::Cluster(_) => {
                info!(
                    "close {path}: not committed again after an earlier error; the file keeps \
                     what its last fsync or close(2) committed"
                );
                (Body::Broken, None)
            }
            Body::Staged(f) if st.dirty && !st.unlinked && st.failed.is_none() => {
                match upload(client, &path, &f, st.staged_size).await {
                    Ok(info) => (Body::Staged(f), Some(info)),
                    Err(e) => {
                        st.failed = Some(errno("close", &path, &e));
                        (Body::Broken, None)
                    }
                }
            }
            other => (other, None),
        };
        st.body = body;
        st.dirty = false;
        info
    }

    /// Reads `len` bytes at `offset` of what has been written (a cluster writer commits what it
    /// has first, so that the members serve it).
    pub(crate) async fn read(
        &self,
        client: &Arc<Client>,
        offset: u64,
        len: u64,
    ) -> Result<Bytes, Errno> {
        let mut st = self.state.lock().await;
        let path = self.path();
        let WriteState {
            body,
            failed,
            staged_size,
            ..
        } = &mut *st;
        let info = match body {
            Body::Cluster(w) => {
                if let Some(e) = failed {
                    return Err(*e);
                }
                // What this writer wrote so far, from its pages in memory or their members:
                // nothing is committed for a read.
                return w
                    .read_at(offset, len)
                    .await
                    .map_err(|e| errno("read", &path, &e));
            }
            Body::Staged(f) => {
                let want = staged_size.saturating_sub(offset).min(len);
                let mut buf = vec![0u8; want as usize];
                tokio::task::block_in_place(|| f.read_exact_at(&mut buf, offset))
                    .map_err(|e| io_errno("read", &path, &e))?;
                return Ok(Bytes::from(buf));
            }
            Body::Closed(info) => info.clone(),
            Body::Unopened | Body::Broken => return Err(Errno::EIO),
        };
        drop(st);
        client
            .read_at(&info, offset, len)
            .await
            .map_err(|e| errno("read", &path, &e))
    }

    /// Marks the file unlinked: a staged one no longer goes to the store.
    pub(crate) async fn unlinked(&self) {
        self.state.lock().await.unlinked = true;
    }
}

/// Commits an idle cluster writer every [`KEEPALIVE`], so that the cluster does not seal it
/// while its descriptors stay open (a writer that writes keeps itself alive).
async fn keepalive(file: Weak<WriteFile>, generation: u64) {
    let tick = KEEPALIVE / 3;
    loop {
        tokio::time::sleep(tick).await;
        let Some(file) = file.upgrade() else { return };
        let mut st = file.state.lock().await;
        if st.failed.is_some() || st.generation != generation {
            return;
        }
        if st.active.elapsed() < KEEPALIVE {
            continue;
        }
        let Body::Cluster(w) = &mut st.body else {
            return;
        };
        let path = file.path();
        match w.flush().await {
            Ok(()) => {
                st.dirty = false;
                st.active = Instant::now();
            }
            Err(e) => {
                st.failed = Some(errno("keep-alive commit", &path, &e));
                return;
            }
        }
    }
}

/// A cluster writer's options: pages a random writer leaves between fsyncs wait in an unlinked
/// file of the staging directory, not sent and read back at each change.
fn spilling(staging: &Path) -> WriteOptions {
    WriteOptions {
        spill_dir: Some(staging.to_path_buf()),
        ..WriteOptions::default()
    }
}

/// A new staging file in `dir` (created if needed), unlinked from the start: it goes with the
/// process.
fn staging_file(dir: &Path) -> std::io::Result<File> {
    std::fs::create_dir_all(dir)?;
    tempfile::tempfile_in(dir)
}

/// Copies the object `info` into the staging file `file` (opening for writing without
/// `O_TRUNC` keeps the content).
async fn copy_into(client: &Arc<Client>, info: &ObjectInfo, file: &File) -> Result<(), Errno> {
    let mut at = 0;
    while at < info.size {
        let n = PART.min(info.size - at);
        let b = client
            .read_at(info, at, n)
            .await
            .map_err(|e| errno("open", &info.path, &e))?;
        if b.len() as u64 != n {
            return Err(Errno::ESTALE);
        }
        tokio::task::block_in_place(|| file.write_all_at(&b, at))
            .map_err(|e| io_errno("open", &info.path, &e))?;
        at += n;
    }
    Ok(())
}

/// Reads `len` bytes at `at` of the staging file.
fn read_part(file: &File, at: u64, len: u64) -> std::io::Result<Bytes> {
    let mut buf = vec![0u8; len as usize];
    tokio::task::block_in_place(|| file.read_exact_at(&mut buf, at))?;
    Ok(Bytes::from(buf))
}

fn store_error(path: &str, e: object_store::Error) -> Error {
    Error::unavailable(format!("{path}: the store refused the upload: {e}"))
}

/// Sends the staged file (`size` bytes) to the store as the object at `path`: one request up
/// to [`PART`] bytes ([`Client::put`]), else a multipart upload from the file, two parts in
/// flight; then the cluster forgets the old version. Returns what a stat now answers.
pub(crate) async fn upload(
    client: &Arc<Client>,
    path: &str,
    file: &File,
    size: u64,
) -> Result<ObjectInfo, Error> {
    let started = Instant::now();
    let part = |at: u64, len: u64| {
        read_part(file, at, len)
            .map_err(|e| Error::unavailable(format!("{path}: reading the staged file: {e}")))
    };
    if size <= PART {
        let info = client.put(path, part(0, size)?).await?;
        return Ok(info);
    }
    let ufs = client.writable()?;
    let old = ufs.stat(path).await.ok().map(|i| i.file_id);
    let mut up = ufs.put_multipart(path).await?;
    // Two parts upload at once, each on its own, while the next is read from the staging file.
    let mut inflight = PartUploads::new(2);
    let mut at = 0;
    let sent: Result<(), Error> = async {
        while at < size {
            let n = PART.min(size - at);
            let p = up.put_part(part(at, n)?.into());
            inflight.start(p).await.map_err(|e| store_error(path, e))?;
            at += n;
        }
        inflight.finish().await.map_err(|e| store_error(path, e))
    }
    .await;
    drop(inflight);
    if let Err(e) = sent {
        if let Err(a) = up.abort().await {
            warn!("{path}: aborting the failed upload: {a}");
        }
        return Err(e);
    }
    up.complete().await.map_err(|e| store_error(path, e))?;
    client.invalidate(path, old).await;
    let info = ufs.stat(path).await?;
    info!(
        "{path}: {size} bytes sent to the store in {:?}",
        started.elapsed()
    );
    Ok(info)
}

/// Sets the modification time of the file at `path` without a descriptor (utimensat), where
/// the cluster keeps it: a file written through the cluster, flushed or not. A file only in
/// the under storage, or a directory, keeps the store's time (accepted: stores have none to
/// set).
pub(crate) async fn set_time(client: &Arc<Client>, path: &str, mtime_ns: i64) -> Result<(), Errno> {
    client
        .touch(path, mtime_ns)
        .await
        .map(|_| ())
        .map_err(|e| errno("setattr", path, &e))
}

/// Cuts or extends the file at `path` to `size` bytes without a descriptor (truncate(2)).
pub(crate) async fn truncate_path(
    client: &Arc<Client>,
    staging: &Path,
    path: &str,
    how: Writes,
    size: u64,
) -> Result<(), Errno> {
    let file = Arc::new(WriteFile::new(0, Arc::from(path), how));
    let start = if size == 0 {
        Start::Truncate
    } else {
        Start::Keep
    };
    // `Start::Truncate` of a cluster file is a fresh version made visible at once, empty:
    // what truncate(2) to 0 does; the close below makes it final.
    file.start(client, staging, start).await?;
    if size != 0 {
        file.truncate(size).await?;
    }
    file.sync(client).await?;
    if file.close(client).await.is_none() {
        let st = file.state.lock().await;
        if let Some(e) = st.failed {
            return Err(e);
        }
    }
    Ok(())
}
