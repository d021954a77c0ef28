//! Writes from Python: a [`FileWriter`] over the client's write-back [`Writer`] (a `write=back`
//! or `write=transient` mount), and what the fsspec file system needs besides (how a path takes
//! writes, namespace changes, `put` for `write=through` mounts, the write-back state).
//!
//! Every call releases the GIL while it waits for the cluster. A writer belongs to the process
//! that opened it: a forked child that inherits one gets `OSError` (EBADF) for every call, as
//! the parent's connections are not its own.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use pyo3::{
    exceptions::{PyOSError, PyTimeoutError, PyValueError},
    prelude::*,
    pybacked::PyBackedBytes,
    types::PyDict,
};

use pagestore_client::{writer::WriteOptions, Client, Writer};

use crate::{errors::to_py, process};

/// A file being written through the cluster: bytes go to their write replicas as each page
/// fills (memory stays bounded by the pages in flight); `close` commits the file (durable on
/// the write replicas, visible to every reader that opens it after).
#[pyclass(module = "pagestore._native")]
pub struct FileWriter {
    path: String,
    pid: u32,
    /// Taken by `close`; the tokio mutex is never contended (the Python side serializes calls),
    /// it only lets a call hold the writer across its awaits.
    inner: Arc<tokio::sync::Mutex<Option<Writer>>>,
    /// The first error the writer met: every later call raises it again (a page may be lost).
    failed: Mutex<Option<(i32, String)>>,
}

impl FileWriter {
    fn check(&self) -> PyResult<()> {
        if self.pid != std::process::id() {
            return Err(PyOSError::new_err((
                libc::EBADF,
                format!("{}: opened for writing by another process", self.path),
            )));
        }
        if let Some((errno, text)) = &*self.failed.lock().unwrap_or_else(|e| e.into_inner()) {
            return Err(PyOSError::new_err((
                *errno,
                text.clone(),
                self.path.clone(),
            )));
        }
        Ok(())
    }

    /// Runs `f` to completion with the GIL released; an error sticks.
    fn finish<T: Send>(
        &self,
        py: Python<'_>,
        f: impl std::future::Future<Output = Result<T, pagestore_client::Error>> + Send,
    ) -> PyResult<T> {
        let p = process()?;
        p.block_on(py, f).map_err(|e| {
            let err = to_py(e);
            let errno = err
                .value(py)
                .getattr("errno")
                .and_then(|v| v.extract::<i32>())
                .unwrap_or(libc::EIO);
            *self.failed.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((errno, err.value(py).to_string()));
            err
        })
    }
}

fn closed(path: &str) -> pagestore_client::Error {
    pagestore_client::Error::BadPath(format!("{path}: the writer is closed"))
}

#[pymethods]
impl FileWriter {
    /// The path written.
    #[getter]
    fn path(&self) -> String {
        self.path.clone()
    }

    /// Writes `data` at `offset` (pages that fill are sent at once). The bytes of a `bytes`
    /// object are not copied for the pages they cover whole: those are sent as they are, and
    /// the object is kept until they are.
    fn write_at(&self, py: Python<'_>, offset: u64, data: PyBackedBytes) -> PyResult<()> {
        self.check()?;
        let data = Bytes::from_owner(data);
        let inner = self.inner.clone();
        let path = &self.path;
        self.finish(py, async move {
            match inner.lock().await.as_mut() {
                Some(w) => w.write_bytes(offset, data).await,
                None => Err(closed(path)),
            }
        })
    }

    /// Cuts or extends the file to `size` bytes.
    fn set_len(&self, py: Python<'_>, size: u64) -> PyResult<()> {
        self.check()?;
        let inner = self.inner.clone();
        let path = &self.path;
        self.finish(py, async move {
            match inner.lock().await.as_mut() {
                Some(w) => w.set_len(size).await,
                None => Err(closed(path)),
            }
        })
    }

    /// Commits what was written so far (durable on the write replicas, visible to readers
    /// that open the file after; `fsync`). The file stays open.
    fn commit(&self, py: Python<'_>) -> PyResult<()> {
        self.check()?;
        let inner = self.inner.clone();
        let path = &self.path;
        self.finish(py, async move {
            match inner.lock().await.as_mut() {
                Some(w) => w.flush().await,
                None => Err(closed(path)),
            }
        })
    }

    /// Commits the file and closes this version for good (the cluster may now flush it to the
    /// store); the file's size.
    fn close(&self, py: Python<'_>) -> PyResult<u64> {
        self.check()?;
        let inner = self.inner.clone();
        let path = &self.path;
        self.finish(py, async move {
            let w = inner.lock().await.take();
            match w {
                Some(w) => w.close().await.map(|info| info.size),
                None => Err(closed(path)),
            }
        })
    }

    /// Drops the writer without committing what was not committed yet (fsspec's discard).
    fn abort(&self) {
        if let Ok(mut g) = self.inner.try_lock() {
            g.take();
        }
    }

    /// Whether `close` (or `abort`) ran.
    #[getter]
    fn closed(&self) -> bool {
        match self.inner.try_lock() {
            Ok(g) => g.is_none(),
            Err(_) => false,
        }
    }
}

/// How `path` takes writes from this client: `"cluster"` (a `write=back` or `write=transient`
/// mount), `"store"` (a `write=through` mount whose store this machine can write: staged and
/// sent whole with `put`), or `"none"` (no mount holds it, or its store cannot be written from
/// here: EROFS).
pub(crate) fn write_mode(client: &Client, path: &str) -> &'static str {
    if mount_prefix(client, path).is_none() {
        return "none";
    }
    if client.write_policy(path).is_cached() {
        return "cluster";
    }
    match client.ufs_table() {
        Some(t) if t.mount_of(path).is_some() => "store",
        _ => "none",
    }
}

/// The prefix of the mount that holds `path` (the longest that matches).
pub(crate) fn mount_prefix(client: &Client, path: &str) -> Option<String> {
    client
        .mounts()
        .into_iter()
        .map(|m| m.prefix.trim_end_matches('/').to_string())
        .filter(|p| p.is_empty() || path == p || path.starts_with(&format!("{p}/")))
        .max_by_key(|p| p.len())
}

pub(crate) fn create(py: Python<'_>, client: Arc<Client>, path: &str) -> PyResult<FileWriter> {
    let p = process()?;
    let options = WriteOptions {
        // As open(2) with O_CREAT: the file is there (empty) at once.
        visible_at_open: true,
        ..WriteOptions::default()
    };
    let owned = path.to_string();
    let w = p
        .block_on(py, async move { client.create(&owned, options).await })
        .map_err(to_py)?;
    Ok(FileWriter {
        path: path.to_string(),
        pid: p.pid(),
        inner: Arc::new(tokio::sync::Mutex::new(Some(w))),
        failed: Mutex::new(None),
    })
}

/// Sends the local file `local` as the object `path` of a `write=through` mount
/// (`Client::put`: read whole into memory, one request).
pub(crate) fn put_file(
    py: Python<'_>,
    client: Arc<Client>,
    path: &str,
    local: std::path::PathBuf,
) -> PyResult<u64> {
    let p = process()?;
    let data = py
        .detach(|| std::fs::read(&local))
        .map_err(|e| PyOSError::new_err((e.raw_os_error().unwrap_or(libc::EIO), e.to_string())))?;
    let path = path.to_string();
    let info = p
        .block_on(
            py,
            async move { client.put(&path, Bytes::from(data)).await },
        )
        .map_err(to_py)?;
    Ok(info.size)
}

/// Waits until nothing under `prefix` waits for the store (files written, deletions and
/// renames), polling every 20 ms; `TimeoutError` after `timeout` seconds. Returns the last
/// state seen.
pub(crate) fn sync<'py>(
    py: Python<'py>,
    client: Arc<Client>,
    prefix: &str,
    timeout: Option<f64>,
) -> PyResult<Bound<'py, PyDict>> {
    let limit = match timeout {
        None => None,
        Some(t) if t.is_finite() && t >= 0.0 => Some(Duration::from_secs_f64(t.min(1e6))),
        Some(t) => {
            return Err(PyValueError::new_err(format!(
                "timeout {t}: give seconds >= 0"
            )))
        }
    };
    let p = process()?;
    let prefix = prefix.to_string();
    let t0 = Instant::now();
    let (s, done) = p
        .block_on(py, async move {
            loop {
                let s = client.write_back_state(&prefix).await?;
                if s.files_dirty == 0 && s.deletes_pending == 0 {
                    return Ok((s, true));
                }
                if limit.is_some_and(|l| t0.elapsed() >= l) {
                    return Ok((s, false));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .map_err(to_py)?;
    let d = PyDict::new(py);
    d.set_item("files_dirty", s.files_dirty)?;
    d.set_item("bytes_dirty", s.bytes_dirty)?;
    d.set_item("deletes_pending", s.deletes_pending)?;
    d.set_item("files_flushing", s.files_flushing)?;
    d.set_item("oldest_dirty_secs", s.oldest_dirty_ms as f64 / 1e3)?;
    d.set_item("flush_errors", s.flush_errors)?;
    d.set_item("last_error", s.last_error.clone())?;
    d.set_item("secs", t0.elapsed().as_secs_f64())?;
    if !done {
        let msg = format!(
            "not in the store after {:.1} s: {} files ({} bytes) and {} deletions or renames \
             waiting; last flush error: {}",
            t0.elapsed().as_secs_f64(),
            s.files_dirty,
            s.bytes_dirty,
            s.deletes_pending,
            if s.last_error.is_empty() {
                "none"
            } else {
                &s.last_error
            }
        );
        return Err(PyTimeoutError::new_err(msg));
    }
    Ok(d)
}
