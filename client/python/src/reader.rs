//! Reads: whole ranges ([`read_into_bytes`], [`cat_ranges`]) and open files ([`Reader`]).
//!
//! Every read of an open file is of the version it was opened at (its `ObjectInfo`, as
//! `FileHandle` pins it), and every read returns exactly the bytes asked for, clipped only at
//! the file's end: a page that comes back shorter than that version's size says is an error
//! (`OSError` ESTALE), never a short read.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Instant,
};

use bytes::Bytes;
use futures_util::{stream, StreamExt};
use pyo3::{exceptions::PyValueError, prelude::*, types::PyBytes};

use pagestore_client::{ufs::ObjectInfo, Client, Error, ReadRun};

use crate::{process, to_py, ClusterRef, Process};

/// `start..end` of a file of `size` bytes, as Python slices count: `None` is the start (the
/// end), a negative number counts from the end; clipped to the file.
pub fn resolve_range(size: u64, start: Option<i64>, end: Option<i64>) -> (u64, u64) {
    let at = |v: i64| -> u64 {
        if v < 0 {
            size.saturating_sub(v.unsigned_abs())
        } else {
            (v as u64).min(size)
        }
    };
    let s = start.map_or(0, at);
    let e = end.map_or(size, at);
    (s, e.max(s))
}

/// The error for a page shorter than the pinned version says.
fn short(info: &ObjectInfo, offset: u64, got: usize, want: u64) -> Error {
    Error::Changed(format!(
        "{}: {got} bytes at {offset} where {want} were expected; the object changed (open it \
         again)",
        info.path
    ))
}

/// Exactly `len` bytes at `offset` of `info` (the caller clipped the range to the file).
async fn read_exact(
    client: &Client,
    info: &ObjectInfo,
    offset: u64,
    len: u64,
) -> Result<Bytes, Error> {
    let b = client.read_at(info, offset, len).await?;
    if b.len() as u64 != len {
        return Err(short(info, offset, b.len(), len));
    }
    Ok(b)
}

/// Bytes `offset..offset+len` of `info` as a Python `bytes`, fetched with the GIL released.
pub fn read_into_bytes<'py>(
    py: Python<'py>,
    p: &Process,
    client: &Arc<Client>,
    info: &ObjectInfo,
    offset: u64,
    len: u64,
) -> PyResult<Bound<'py, PyBytes>> {
    let t0 = Instant::now();
    let b = p
        .block_on(py, read_exact(client, info, offset, len))
        .map_err(to_py)?;
    let out = PyBytes::new(py, &b);
    p.reads.record(t0, len);
    Ok(out)
}

/// `chunks` (in order, `n` bytes in all) as one Python `bytes`. One chunk (a read within one
/// page: every aligned read of at most a page) is copied once; several are copied once each into
/// a `bytes` that PyO3 zero-fills first.
fn joined<'py>(py: Python<'py>, chunks: &[Bytes], n: usize) -> PyResult<Bound<'py, PyBytes>> {
    if let [one] = chunks {
        return Ok(PyBytes::new(py, one));
    }
    PyBytes::new_with(py, n, |buf| {
        let mut at = 0;
        for c in chunks {
            buf[at..at + c.len()].copy_from_slice(c);
            at += c.len();
        }
        Ok(())
    })
}

/// `e` again (the typed kind and message; an underlying error is not kept): the error of a
/// stat, for each range of its path.
fn again(e: &Error) -> Error {
    match e {
        Error::NotFound(p) => Error::NotFound(p.clone()),
        Error::IsDir(p) => Error::IsDir(p.clone()),
        Error::NotDir(p) => Error::NotDir(p.clone()),
        Error::BadPath(m) => Error::BadPath(m.clone()),
        Error::Invalid(m) => Error::Invalid(m.clone()),
        Error::Changed(m) => Error::Changed(m.clone()),
        Error::BadRange(m) => Error::BadRange(m.clone()),
        Error::Forbidden(m) => Error::Forbidden(m.clone()),
        Error::Exists(m) => Error::Exists(m.clone()),
        Error::Precondition(m) => Error::Precondition(m.clone()),
        Error::NotEmpty(m) => Error::NotEmpty(m.clone()),
        Error::NoSpace(m) => Error::NoSpace(m.clone()),
        Error::ReadOnly(m) => Error::ReadOnly(m.clone()),
        Error::Unavailable { message, .. } => Error::unavailable(message.clone()),
        Error::Config { message, .. } => Error::config(message.clone()),
    }
}

/// Each range's bytes (or error), the paths stat'ed once each and the ranges read `parallel` at
/// a time.
pub async fn cat_ranges(
    client: Arc<Client>,
    paths: Vec<String>,
    starts: Vec<Option<i64>>,
    ends: Vec<Option<i64>>,
    parallel: usize,
) -> Vec<Result<Bytes, Error>> {
    let mut unique = paths.clone();
    unique.sort_unstable();
    unique.dedup();
    let infos: HashMap<String, Arc<Result<ObjectInfo, Error>>> = stream::iter(unique)
        .map(|path| {
            let c = client.clone();
            async move {
                let r = c.stat(&path).await;
                (path, Arc::new(r))
            }
        })
        .buffer_unordered(parallel)
        .collect()
        .await;
    let jobs: Vec<_> = paths
        .into_iter()
        .zip(starts)
        .zip(ends)
        .map(|((p, s), e)| (infos.get(&p).cloned(), s, e))
        .collect();
    stream::iter(jobs)
        .map(|(info, s, e)| {
            let c = client.clone();
            async move {
                let info = info.ok_or_else(|| Error::unavailable("path not stat'ed"))?;
                match &*info {
                    Err(err) => Err(again(err)),
                    Ok(info) => {
                        let (s, e) = resolve_range(info.size, s, e);
                        read_exact(&c, info, s, e - s).await
                    }
                }
            }
        })
        .buffered(parallel)
        .collect()
        .await
}

/// What an open file keeps between reads.
struct State {
    /// The process these fields belong to (a forked child starts afresh).
    pid: u32,
    client: Arc<Client>,
    pos: u64,
    /// Sequential or random: whether reads get whole pages and the read-ahead.
    run: ReadRun,
    /// Whole pages fetched ahead of a sequential reader, and the page it is in.
    pages: BTreeMap<u64, tokio::task::JoinHandle<Result<Bytes, Error>>>,
    current: Option<(u64, Bytes)>,
}

impl Drop for State {
    /// A closed (or collected) file stops its read-ahead: a dropped `JoinHandle` would leave
    /// the fetches running for nobody. Not in a forked child, where the tasks belong to the
    /// parent's runtime (gone with its threads).
    fn drop(&mut self) {
        if self.pid == std::process::id() {
            for h in self.pages.values() {
                h.abort();
            }
        }
    }
}

/// An open file of the cluster (`Cluster.open`): seekable, pinned to one version, with
/// read-ahead while it is read sequentially. Calls from several threads take turns (the lock
/// is waited for with the GIL released).
///
/// A read that starts where the previous one ended is sequential. Once a run of sequential
/// reads started at the file's start or is longer than a page ([`ReadRun`]), its reads are
/// served from whole pages, and the next `readahead` pages (the client option) are fetched in
/// the background meanwhile. Any other read (the first one, one after a seek, the first page's
/// worth of a run from elsewhere) fetches only its own range,
/// with the pages it covers in parallel, and a read after a seek stops the read-ahead: random
/// readers pay for no page they do not read, even where two of their reads happen to meet.
#[pyclass(frozen, module = "pagestore._native")]
pub struct Reader {
    cluster: ClusterRef,
    info: Arc<ObjectInfo>,
    /// `None` once closed. A tokio lock for its owned guard, which may cross `detach`.
    state: Arc<tokio::sync::Mutex<Option<State>>>,
}

/// The held state of a [`Reader`].
type Guard = tokio::sync::OwnedMutexGuard<Option<State>>;

impl Reader {
    pub(crate) fn new(
        cluster: ClusterRef,
        info: ObjectInfo,
        pid: u32,
        client: Arc<Client>,
    ) -> Reader {
        Reader {
            cluster,
            info: Arc::new(info),
            state: Arc::new(tokio::sync::Mutex::new(Some(State::new(pid, client, 0)))),
        }
    }
}

impl State {
    fn new(pid: u32, client: Arc<Client>, pos: u64) -> State {
        State {
            pid,
            client,
            pos,
            run: ReadRun::default(),
            pages: BTreeMap::new(),
            current: None,
        }
    }

    /// Starts fetching `page` unless it is under way.
    fn start(&mut self, info: &Arc<ObjectInfo>, p: &Process, page: u64) {
        let ps = u64::from(self.client.page_size());
        if self.pages.contains_key(&page) || page.saturating_mul(ps) >= info.size {
            return;
        }
        let (client, info) = (self.client.clone(), info.clone());
        self.pages.insert(
            page,
            p.spawn(async move {
                let ps = u64::from(client.page_size());
                let want = (info.size - page * ps).min(ps);
                let b = client.read_page(&info, page, 0, ps as u32).await?;
                if b.len() as u64 != want {
                    return Err(short(&info, page * ps, b.len(), want));
                }
                Ok(b)
            }),
        );
    }

    /// Stops the read-ahead.
    fn drop_pages(&mut self) {
        for h in self.pages.values() {
            h.abort();
        }
        self.pages.clear();
    }

    /// Page `page`, from the page in hand, the read-ahead, or fetched now.
    async fn page(
        &mut self,
        info: &Arc<ObjectInfo>,
        p: &Process,
        page: u64,
    ) -> Result<Bytes, Error> {
        if let Some((n, b)) = &self.current {
            if *n == page {
                return Ok(b.clone());
            }
        }
        self.start(info, p, page);
        let Some(h) = self.pages.remove(&page) else {
            return Ok(Bytes::new());
        };
        let b = h
            .await
            .map_err(|e| Error::unavailable(format!("page fetch ended: {e}")))??;
        self.current = Some((page, b.clone()));
        Ok(b)
    }

    /// The `len` bytes at `self.pos` (the caller clipped them to the file), as slices of the
    /// pages that hold them: nothing is copied here.
    async fn gather(
        &mut self,
        info: &Arc<ObjectInfo>,
        p: &Process,
        len: u64,
    ) -> Result<Vec<Bytes>, Error> {
        let pos = self.pos;
        let ps = u64::from(self.client.page_size());
        // Whole pages and the read-ahead only for a sequential run (see `ReadRun`); any other
        // read fetches its own range, and a seek stops the read-ahead.
        if !self.run.record(pos, len, ps) {
            self.drop_pages();
            // Run on the runtime, beside the connection it waits on: the answer's packets wake
            // a worker, and this thread is woken once, when the bytes are all there.
            let (client, info) = (self.client.clone(), info.clone());
            let b = p
                .spawn(async move { read_exact(&client, &info, pos, len).await })
                .await
                .map_err(|e| Error::unavailable(format!("read ended: {e}")))??;
            return Ok(vec![b]);
        }
        let (first, last) = (pos / ps, (pos + len - 1) / ps);
        let ahead = self.client.options().readahead as u64;
        // Everything the reader will want next is in flight before we wait for the first page.
        for page in first..=last + ahead {
            self.start(info, p, page);
        }
        self.pages.retain(|&n, h| {
            let keep = n >= first;
            if !keep {
                h.abort();
            }
            keep
        });
        let mut at = pos;
        let mut chunks = Vec::with_capacity((last - first + 1) as usize);
        for page in first..=last {
            let b = self.page(info, p, page).await?;
            let off = (at - page * ps) as usize;
            let want = ((page + 1) * ps).min(pos + len) - at;
            let n = b.len().saturating_sub(off).min(want as usize);
            if n as u64 != want {
                return Err(short(info, at, n, want));
            }
            chunks.push(b.slice(off..off + n));
            at += n as u64;
        }
        Ok(chunks)
    }
}

#[pymethods]
impl Reader {
    /// Reads up to `size` bytes (all that is left for a negative or missing size); `b""` at the
    /// end of the file.
    #[pyo3(signature = (size=-1))]
    fn read<'py>(&self, py: Python<'py>, size: i64) -> PyResult<Bound<'py, PyBytes>> {
        let p = process()?;
        let mut guard = self.lock(py);
        let st = self.current(py, &mut guard, p)?;
        let left = self.info.size.saturating_sub(st.pos);
        let len = if size < 0 {
            left
        } else {
            (size as u64).min(left)
        };
        let n = usize::try_from(len).map_err(|_| PyValueError::new_err("read too large"))?;
        let t0 = Instant::now();
        let info = &self.info;
        let chunks = if n == 0 {
            Vec::new()
        } else {
            p.block_on(py, st.gather(info, p, len)).map_err(to_py)?
        };
        let out = joined(py, &chunks, n)?;
        st.pos += len;
        if len > 0 {
            p.reads.record(t0, len);
        }
        Ok(out)
    }

    /// Moves the read position (`whence` 0: from the start, 1: from here, 2: from the end);
    /// returns the new position. Past the end is allowed (reads there return `b""`).
    #[pyo3(signature = (offset, whence=0))]
    fn seek(&self, py: Python<'_>, offset: i64, whence: i32) -> PyResult<u64> {
        let p = process()?;
        let mut guard = self.lock(py);
        let st = self.current(py, &mut guard, p)?;
        let base = match whence {
            0 => 0,
            1 => st.pos,
            2 => self.info.size,
            w => return Err(PyValueError::new_err(format!("whence {w}: use 0, 1 or 2"))),
        };
        let to = base
            .checked_add_signed(offset)
            .ok_or_else(|| PyValueError::new_err("negative seek position"))?;
        st.pos = to;
        Ok(to)
    }

    /// The read position.
    fn tell(&self, py: Python<'_>) -> PyResult<u64> {
        let p = process()?;
        let mut guard = self.lock(py);
        Ok(self.current(py, &mut guard, p)?.pos)
    }

    /// Stops the read-ahead and lets go of the pages held.
    fn close(&self, py: Python<'_>) {
        let mut guard = self.lock(py);
        if let Some(st) = guard.take() {
            if st.pid == std::process::id() {
                drop(st);
            } else {
                std::mem::forget(st);
            }
        }
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        self.lock(py).is_none()
    }

    /// The logical path.
    #[getter]
    fn path(&self) -> &str {
        &self.info.path
    }

    /// The size of the pinned version.
    #[getter]
    fn size(&self) -> u64 {
        self.info.size
    }

    /// The pinned version's modification time (Unix seconds).
    #[getter]
    fn mtime(&self) -> f64 {
        self.info.mtime_ns as f64 / 1e9
    }

    /// The pinned version tag.
    #[getter]
    fn version(&self) -> &str {
        &self.info.version
    }
}

impl Reader {
    /// Takes this reader's lock, waiting for it with the GIL released.
    fn lock(&self, py: Python<'_>) -> Guard {
        let state = self.state.clone();
        py.detach(move || state.blocking_lock_owned())
    }

    /// The state for this process: in a forked child, the parent's is left alone (its tasks ran
    /// on the parent's runtime) and a new one starts at the same position with this process's
    /// client, still reading the pinned version. Closed files raise `ValueError`.
    fn current<'a>(
        &self,
        py: Python<'_>,
        guard: &'a mut Guard,
        p: &Process,
    ) -> PyResult<&'a mut State> {
        let pid = p.pid();
        let old_pos = match guard.as_ref() {
            None => return Err(PyValueError::new_err("I/O operation on closed file")),
            Some(s) if s.pid != pid => Some(s.pos),
            Some(_) => None,
        };
        if let Some(pos) = old_pos {
            std::mem::forget(guard.take());
            let client = self.cluster.client(py)?;
            **guard = Some(State::new(pid, client, pos));
        }
        guard
            .as_mut()
            .ok_or_else(|| PyValueError::new_err("I/O operation on closed file"))
    }
}
