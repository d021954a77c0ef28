//! `pagestore._native`: the client library for Python (PyO3). The Python side
//! (`python/pagestore/`) builds the fsspec file system on these types:
//!
//! - [`Cluster`]: how to reach a cluster (the `pagectl` cluster options, defaults from the same
//!   environment variables) and one connected client per process.
//! - [`Reader`]: an open file pinned to the version it was opened at, with read-ahead for
//!   sequential readers.
//! - [`PreloadJob`]: a preload job (`pagectl load`'s code, `pagestore_cli::load`).
//! - `stats()`: the three numbers as far as a client can know them.
//!
//! **Threads and processes.** Every blocking call releases the GIL and runs on one tokio
//! runtime per process ([`process`]). A forked child (a data loader's worker) sees a new process
//! id on its first call and starts its own runtime and its own connections: what the parent
//! left behind (its runtime's threads do not exist in the child) is never touched, only leaked.
//! `spawn`ed workers start from nothing anyway.
//!
//! One more thing a fork copies: the thread's random generator (`rand::rng()`), which quinn
//! draws connection ids from. A child and its siblings would pick the parent's next ids, and a
//! node routes an Initial by its id: the second child's handshake would go to the first's
//! connection and time out. Every thread that drives I/O reseeds its generator the first time
//! it does so in a process ([`fresh_thread_rng`]).

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicPtr, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use pyo3::{
    exceptions::{PyOSError, PyRuntimeError, PyValueError},
    prelude::*,
    types::{PyBytes, PyDict, PyList},
};

use pagestore_cli::ClusterArgs;
use pagestore_client::{Client, Error};

mod errors;
mod job;
mod reader;
mod stats;
mod writer;

pub use errors::to_py;

/// What one process holds: its runtime and its clients. A forked child makes a new one (see
/// the module docs); the parent's is leaked there.
pub(crate) struct Process {
    pid: u32,
    runtime: tokio::runtime::Runtime,
    /// Connected clients by [`Cluster`] id.
    clients: Mutex<HashMap<u64, Arc<Client>>>,
    /// This process's reads through this module (for `stats()`).
    pub(crate) reads: stats::ReadStats,
}

static PROCESS: AtomicPtr<Process> = AtomicPtr::new(std::ptr::null_mut());

/// This process's [`Process`], made on the first call and again after a fork.
pub(crate) fn process() -> PyResult<&'static Process> {
    let pid = std::process::id();
    let cur = PROCESS.load(Ordering::Acquire);
    // SAFETY: a non-null PROCESS always points to a leaked `Box<Process>` (below), never freed.
    if let Some(p) = unsafe { cur.as_ref() } {
        if p.pid == pid {
            return Ok(p);
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("pagestore-io")
        .enable_all()
        .build()
        .map_err(|e| PyOSError::new_err(format!("cannot start the I/O runtime: {e}")))?;
    let fresh = Box::into_raw(Box::new(Process {
        pid,
        runtime,
        clients: Mutex::new(HashMap::new()),
        reads: stats::ReadStats::default(),
    }));
    match PROCESS.compare_exchange(cur, fresh, Ordering::AcqRel, Ordering::Acquire) {
        // The old one (the parent's, in a forked child) is leaked: its threads are gone, and
        // dropping its runtime would wait for them.
        // SAFETY: `fresh` was just leaked from a Box and is now published, never freed.
        Ok(_) => Ok(unsafe { &*fresh }),
        Err(winner) => {
            // Another thread of this process made one first: use it, drop ours (its runtime
            // has run nothing yet).
            // SAFETY: `fresh` was never published; we own it.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: as above, a published pointer is never freed.
            let w = unsafe { &*winner };
            if w.pid == pid {
                Ok(w)
            } else {
                Err(PyRuntimeError::new_err(
                    "pagestore: process state changed under a fork",
                ))
            }
        }
    }
}

/// Reseeds this thread's `rand::rng()` the first time the thread drives I/O in this process
/// (see the module docs): a forked child's copy of the parent's state would repeat the parent's
/// connection ids.
fn fresh_thread_rng() {
    thread_local! {
        static SEEDED_IN: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    let pid = std::process::id();
    SEEDED_IN.with(|seeded| {
        if seeded.get() != pid {
            if let Err(e) = rand::rng().reseed() {
                tracing::warn!(error = %e, "cannot reseed the thread's random generator");
            }
            seeded.set(pid);
        }
    });
}

impl Process {
    /// Runs `f` to completion on this process's runtime with the GIL released (`f` itself runs
    /// on the calling thread; tasks it spawns on the runtime's).
    pub(crate) fn block_on<F>(&self, py: Python<'_>, f: F) -> F::Output
    where
        F: std::future::Future + Send,
        F::Output: Send,
    {
        py.detach(|| {
            fresh_thread_rng();
            self.runtime.block_on(f)
        })
    }

    pub(crate) fn spawn<F>(&self, f: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.runtime.spawn(f)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }
}

/// A listing entry as Python gets it: (name, is_dir, size, version, mtime).
type ListEntry = (String, bool, u64, String, f64);

static NEXT_CLUSTER: AtomicU64 = AtomicU64::new(1);

/// How to reach a cluster: `pagectl`'s cluster options (`cluster`, `tls_dir`, `timeout`,
/// `fallback`, the etcd ones; unset ones from `PAGESTORE_CLUSTER`, `PAGESTORE_TLS_DIR`, ...) and
/// the client's read settings. Connects on first use, once per process.
#[pyclass(frozen, module = "pagestore._native")]
pub struct Cluster {
    id: u64,
    args: ClusterArgs,
    readahead: Option<usize>,
    parallel: Option<usize>,
}

#[pymethods]
impl Cluster {
    #[new]
    #[pyo3(signature = (cluster=None, tls_dir=None, timeout=None, fallback=true, readahead=None,
        parallel=None, etcd_user=None, etcd_password_file=None, etcd_ca=None, etcd_cert=None,
        etcd_key=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        cluster: Option<String>,
        tls_dir: Option<std::path::PathBuf>,
        timeout: Option<f64>,
        fallback: bool,
        readahead: Option<usize>,
        parallel: Option<usize>,
        etcd_user: Option<String>,
        etcd_password_file: Option<String>,
        etcd_ca: Option<String>,
        etcd_cert: Option<String>,
        etcd_key: Option<String>,
    ) -> PyResult<Cluster> {
        let timeout = match timeout {
            None => None,
            Some(t) if t.is_finite() && t > 0.0 => {
                Some(Duration::from_secs_f64(t.clamp(0.01, 1e6)))
            }
            Some(t) => {
                return Err(PyValueError::new_err(format!(
                    "timeout {t}: give seconds > 0"
                )))
            }
        };
        if parallel == Some(0) {
            return Err(PyValueError::new_err("parallel must be at least 1"));
        }
        let args = ClusterArgs {
            cluster,
            tls_dir,
            timeout,
            no_fallback: !fallback,
            etcd_user,
            etcd_password_file,
            etcd_ca,
            etcd_cert,
            etcd_key,
        };
        // Settings errors now, not at the first read.
        args.client_options()
            .map_err(|e| to_py(Error::config(e.to_string())))?;
        Ok(Cluster {
            id: NEXT_CLUSTER.fetch_add(1, Ordering::Relaxed),
            args,
            readahead,
            parallel,
        })
    }

    /// The cluster these options name (`--cluster`, else `$PAGESTORE_CLUSTER`, else the
    /// single-node default).
    #[getter]
    fn address(&self) -> String {
        self.args.cluster()
    }

    /// Connects now (otherwise the first call does); raises what a connection error is.
    fn connect(&self, py: Python<'_>) -> PyResult<()> {
        self.client(py).map(|_| ())
    }

    /// The cluster's page size in bytes.
    #[getter]
    fn page_size(&self, py: Python<'_>) -> PyResult<u32> {
        Ok(self.client(py)?.page_size())
    }

    /// What `path` is: a dict with name, type ("file" or "directory"), size, and for files
    /// version, mtime (Unix seconds) and file_id; a directory made through the cluster has an
    /// mtime too.
    fn info<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyDict>> {
        let client = self.client(py)?;
        let p = process()?;
        let kind = p
            .block_on(py, async { client.stat_path(path).await })
            .map_err(to_py)?;
        let d = PyDict::new(py);
        d.set_item("name", path)?;
        match kind {
            pagestore_protocol::frame::PathKind::Dir { mtime_ns } => {
                d.set_item("type", "directory")?;
                d.set_item("size", 0)?;
                if mtime_ns != 0 {
                    d.set_item("mtime", mtime_ns as f64 / 1e9)?;
                }
            }
            pagestore_protocol::frame::PathKind::File {
                size,
                version_tag,
                file_id,
                mtime_ns,
                ..
            } => {
                d.set_item("type", "file")?;
                d.set_item("size", size)?;
                d.set_item("version", version_tag)?;
                d.set_item("mtime", mtime_ns as f64 / 1e9)?;
                d.set_item("file_id", format!("{:032x}", file_id.as_u128()))?;
            }
        }
        Ok(d)
    }

    /// The entries of directory `path`, sorted by name: (name, is_dir, size, version, mtime).
    fn list(&self, py: Python<'_>, path: &str) -> PyResult<Vec<ListEntry>> {
        let client = self.client(py)?;
        let p = process()?;
        let entries = p
            .block_on(py, async { client.list(path).await })
            .map_err(to_py)?;
        Ok(entries
            .into_iter()
            .map(|e| {
                (
                    e.name,
                    e.is_dir,
                    e.size,
                    e.version_tag,
                    e.mtime_ns as f64 / 1e9,
                )
            })
            .collect())
    }

    /// Every file under `path` (or `path` itself if it is a file), walking directories
    /// concurrently, sorted: (path, size, version, mtime).
    fn walk(&self, py: Python<'_>, path: &str) -> PyResult<Vec<(String, u64, String, f64)>> {
        let client = self.client(py)?;
        let p = process()?;
        let targets = p
            .block_on(py, async {
                let t = pagestore_cli::load::walk(&client, path).await?;
                let mut out = Vec::with_capacity(t.len());
                for f in t {
                    let info = match f.listed {
                        Some(i) => i,
                        None => client.stat(&f.path).await?,
                    };
                    out.push((f.path, info.size, info.version, info.mtime_ns as f64 / 1e9));
                }
                Ok::<_, pagestore_cli::load::LoadError>(out)
            })
            .map_err(errors::load_to_py)?;
        Ok(targets)
    }

    /// Opens `path` for reading, pinned to the version that exists now.
    fn open(&self, py: Python<'_>, path: &str) -> PyResult<reader::Reader> {
        let client = self.client(py)?;
        let p = process()?;
        let info = p
            .block_on(py, async { client.stat(path).await })
            .map_err(to_py)?;
        Ok(reader::Reader::new(self.inner(), info, p.pid(), client))
    }

    /// Opens `path` at a version known already (a pickled file's): no stat; every read is of
    /// that version or fails (`OSError` ESTALE) where it is gone.
    #[pyo3(signature = (path, size, version, mtime=0.0))]
    fn open_version(
        &self,
        py: Python<'_>,
        path: &str,
        size: u64,
        version: String,
        mtime: f64,
    ) -> PyResult<reader::Reader> {
        let client = self.client(py)?;
        let p = process()?;
        // What a listing of it says (a file written through the cluster and flushed is
        // read from its write members, as one not flushed yet).
        let entry = pagestore_protocol::frame::DirEntry {
            name: String::new(),
            is_dir: false,
            size,
            version_tag: version,
            mtime_ns: (mtime * 1e9) as i64,
        };
        let info = pagestore_client::ufs::ObjectInfo::listed(path.to_string(), &entry)
            .ok_or_else(|| PyValueError::new_err(format!("{path}: no version to open it at")))?;
        Ok(reader::Reader::new(self.inner(), info, p.pid(), client))
    }

    /// Bytes `start..end` of `path` (clipped to its size; `None`: from the start, to the end;
    /// negative: from the end), all of one version.
    #[pyo3(signature = (path, start=None, end=None))]
    fn cat_file<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        start: Option<i64>,
        end: Option<i64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let client = self.client(py)?;
        let p = process()?;
        let info = p
            .block_on(py, async { client.stat(path).await })
            .map_err(to_py)?;
        let (s, e) = reader::resolve_range(info.size, start, end);
        reader::read_into_bytes(py, p, &client, &info, s, e - s)
    }

    /// Many ranges at once (fetched in parallel, each path stat'ed once): a list with, for
    /// each range, its bytes or the exception that range raised.
    fn cat_ranges<'py>(
        &self,
        py: Python<'py>,
        paths: Vec<String>,
        starts: Vec<Option<i64>>,
        ends: Vec<Option<i64>>,
    ) -> PyResult<Bound<'py, PyList>> {
        if paths.len() != starts.len() || paths.len() != ends.len() {
            return Err(PyValueError::new_err(
                "paths, starts and ends must have the same length",
            ));
        }
        let client = self.client(py)?;
        let p = process()?;
        let parallel = client.options().parallel.max(1) * 2;
        let t0 = Instant::now();
        let results = p.block_on(
            py,
            reader::cat_ranges(client.clone(), paths, starts, ends, parallel),
        );
        let out = PyList::empty(py);
        let mut total = 0;
        for r in results {
            match r {
                Ok(b) => {
                    total += b.len() as u64;
                    out.append(PyBytes::new(py, &b))?;
                }
                Err(e) => out.append(to_py(e).into_value(py))?,
            }
        }
        p.reads.record(t0, total);
        Ok(out)
    }

    /// How `path` takes writes from this client: `"cluster"` (a `write=back` or
    /// `write=transient` mount: written through the cluster), `"store"` (a `write=through`
    /// mount whose store this machine can write: `put`), `"none"` (read-only here: EROFS).
    fn write_mode(&self, py: Python<'_>, path: &str) -> PyResult<&'static str> {
        Ok(writer::write_mode(&*self.client(py)?, path))
    }

    /// The prefix of the mount that holds `path` (the longest that matches), or None.
    fn mount_prefix(&self, py: Python<'_>, path: &str) -> PyResult<Option<String>> {
        Ok(writer::mount_prefix(&*self.client(py)?, path))
    }

    /// The write policy of the mount of `path` (`"through"`, `"back"` or `"transient"`).
    fn write_policy(&self, py: Python<'_>, path: &str) -> PyResult<&'static str> {
        Ok(self.client(py)?.write_policy(path).as_str())
    }

    /// Starts writing `path` anew through the cluster (empty, visible at once; a `write=back`
    /// or `write=transient` mount, else `OSError` EROFS).
    fn create(&self, py: Python<'_>, path: &str) -> PyResult<writer::FileWriter> {
        let client = self.client(py)?;
        writer::create(py, client, path)
    }

    /// Sends the local file `local` as the object `path` (`Client::put`: to the store on a
    /// `write=through` mount, through the cluster otherwise); its size.
    fn put_file(&self, py: Python<'_>, path: &str, local: std::path::PathBuf) -> PyResult<u64> {
        let client = self.client(py)?;
        writer::put_file(py, client, path, local)
    }

    /// Deletes the file `path` (`Client::delete`).
    fn delete(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let client = self.client(py)?;
        let p = process()?;
        p.block_on(py, async { client.delete(path).await })
            .map_err(to_py)
    }

    /// Renames the file `from` to `to` within one `write=back` or `write=transient` mount,
    /// atomically for readers; an existing `to` is replaced only with `replace`.
    #[pyo3(signature = (from, to, replace=true))]
    fn rename(&self, py: Python<'_>, from: &str, to: &str, replace: bool) -> PyResult<()> {
        let client = self.client(py)?;
        let p = process()?;
        p.block_on(py, async { client.rename(from, to, replace).await })
            .map_err(to_py)
    }

    /// Sets the modification time (nanoseconds since the Unix epoch) of what `path` holds,
    /// where the cluster keeps it: a file or a directory made through the cluster. False when
    /// the path is a file or a directory only in the under storage (whose time is the store's).
    fn set_mtime(&self, py: Python<'_>, path: &str, mtime_ns: i64) -> PyResult<bool> {
        let client = self.client(py)?;
        let p = process()?;
        p.block_on(py, async { client.touch(path, mtime_ns).await })
            .map_err(to_py)
    }

    /// Makes the directory `path` (a `write=back` or `write=transient` mount).
    fn make_dir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let client = self.client(py)?;
        let p = process()?;
        p.block_on(py, async { client.make_dir(path).await })
            .map_err(to_py)
    }

    /// Removes the empty directory `path` (a `write=back` or `write=transient` mount).
    fn remove_dir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let client = self.client(py)?;
        let p = process()?;
        p.block_on(py, async { client.remove_dir(path).await })
            .map_err(to_py)
    }

    /// Waits until nothing under `prefix` waits for the store (see `pagestore.sync`).
    #[pyo3(signature = (prefix, timeout=None))]
    fn sync<'py>(
        &self,
        py: Python<'py>,
        prefix: &str,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let client = self.client(py)?;
        writer::sync(py, client, prefix, timeout)
    }

    /// Starts a preload job (see `pagestore.preload`): `paths` (a manifest's paths) or `prefix`.
    #[pyo3(signature = (paths=None, prefix=None, source=String::new(), parallel=16, verify=false))]
    fn preload(
        &self,
        py: Python<'_>,
        paths: Option<Vec<String>>,
        prefix: Option<String>,
        source: String,
        parallel: usize,
        verify: bool,
    ) -> PyResult<job::PreloadJob> {
        let client = self.client(py)?;
        job::start(py, client, paths, prefix, source, parallel, verify)
    }

    /// The job records the nodes keep, most recent first (as `pagectl jobs` shows them).
    fn jobs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let client = self.client(py)?;
        let p = process()?;
        let records = p
            .block_on(py, async { client.jobs().await })
            .map_err(to_py)?;
        let out = PyList::empty(py);
        for r in &records {
            out.append(job::record_dict(py, r)?)?;
        }
        Ok(out)
    }

    /// The three numbers (hit ratio, read bandwidth, time to first batch) as this process can
    /// know them: see `pagestore.stats`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let client = self.client(py)?;
        stats::stats(py, &client)
    }

    fn __repr__(&self) -> String {
        format!("Cluster({:?})", self.args.cluster())
    }
}

/// What readers and jobs keep of their cluster (to reconnect after a fork).
#[derive(Clone)]
pub(crate) struct ClusterRef {
    id: u64,
    args: Arc<ClusterArgs>,
    readahead: Option<usize>,
    parallel: Option<usize>,
}

impl Cluster {
    fn inner(&self) -> ClusterRef {
        ClusterRef {
            id: self.id,
            args: Arc::new(self.args.clone()),
            readahead: self.readahead,
            parallel: self.parallel,
        }
    }

    fn client(&self, py: Python<'_>) -> PyResult<Arc<Client>> {
        self.inner().client(py)
    }
}

impl ClusterRef {
    /// This process's client of the cluster, connecting on first use.
    pub(crate) fn client(&self, py: Python<'_>) -> PyResult<Arc<Client>> {
        let p = process()?;
        if let Some(c) = p
            .clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&self.id)
        {
            return Ok(c.clone());
        }
        p.reads.connecting();
        let (args, readahead, parallel) = (self.args.clone(), self.readahead, self.parallel);
        let client = p
            .block_on(py, async move {
                let mut options = args.client_options()?;
                if let Some(r) = readahead {
                    options.readahead = r;
                }
                if let Some(n) = parallel {
                    options.parallel = n;
                }
                args.connect_with(options, None).await
            })
            .map_err(errors::cli_to_py)?;
        let mut map = p.clients.lock().unwrap_or_else(|e| e.into_inner());
        Ok(map.entry(self.id).or_insert(client).clone())
    }
}

/// The paths of a manifest (`pagectl load --manifest`'s format: one logical path per line, or
/// JSON lines with a `path` field; blank lines and `#` comments skipped); `ValueError` names the
/// first bad line.
#[pyfunction]
fn parse_manifest(text: &str) -> PyResult<Vec<String>> {
    pagestore_cli::load::parse_manifest(text).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// `pagestore._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    if std::env::var_os("PAGESTORE_LOG").is_some() || std::env::var_os("RUST_LOG").is_some() {
        pagestore_cli::init_logging();
    }
    m.add_class::<Cluster>()?;
    m.add_class::<reader::Reader>()?;
    m.add_class::<job::PreloadJob>()?;
    m.add_class::<writer::FileWriter>()?;
    m.add_function(wrap_pyfunction!(parse_manifest, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
