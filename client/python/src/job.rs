//! Preload jobs from Python: `pagectl load`'s job ([`pagestore_cli::load`]) run on this
//! process's runtime, its report as a dict.

use std::{sync::Arc, time::Duration};

use pyo3::{
    exceptions::{PyRuntimeError, PyTimeoutError},
    prelude::*,
    types::PyDict,
};

use pagestore_cli::load::{self, JobReport, LoadError, LoadOptions};

use pagestore_client::{Client, JobRecord};

use crate::{errors::load_to_py, process};

type Outcome = Result<JobReport, LoadError>;

/// A preload job started by `pagestore.preload` (`Cluster.preload`). It runs in the background
/// in the process that started it; `wait()` returns its report.
#[pyclass(frozen, module = "pagestore._native")]
pub struct PreloadJob {
    id: String,
    pid: u32,
    client: Arc<Client>,
    /// The running job, then its outcome (taken by the first `wait` that sees it end).
    state: Arc<tokio::sync::Mutex<JobState>>,
}

enum JobState {
    Running(tokio::task::JoinHandle<Outcome>),
    Done(Result<JobReport, PyErr>),
}

/// Starts a job over `paths` (a manifest's) or everything under `prefix`.
pub fn start(
    py: Python<'_>,
    client: Arc<Client>,
    paths: Option<Vec<String>>,
    prefix: Option<String>,
    source: String,
    parallel: usize,
    verify: bool,
) -> PyResult<PreloadJob> {
    let p = process()?;
    let opts = LoadOptions {
        parallel: parallel.max(1),
        verify,
        source,
        progress: false,
        ..LoadOptions::default()
    };
    let id = opts.id.clone();
    let c = client.clone();
    let handle = p.spawn(async move {
        let files = match (paths, prefix) {
            (Some(paths), _) => load::JobFiles::Manifest(paths),
            (None, Some(prefix)) => load::prefix_files(&c, &prefix).await?,
            (None, None) => load::JobFiles::Known(Vec::new()),
        };
        Ok(load::run_job(c, files, &opts).await)
    });
    let _ = py;
    Ok(PreloadJob {
        id,
        pid: p.pid(),
        client,
        state: Arc::new(tokio::sync::Mutex::new(JobState::Running(handle))),
    })
}

/// The report as a dict: files, failed, bytes_total, bytes_loaded, pages_loaded, pages_present,
/// time_to_first_page (seconds from submission to the first page cached, or None),
/// total_secs, resolve_secs, failures (a list of (path, why)), and the job id.
fn report_dict<'py>(py: Python<'py>, id: &str, r: &JobReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("id", id)?;
    d.set_item("files", r.files)?;
    d.set_item("failed", r.failed)?;
    d.set_item("bytes_total", r.bytes_total)?;
    d.set_item("bytes_loaded", r.bytes_loaded)?;
    d.set_item("pages_loaded", r.pages_loaded)?;
    d.set_item("pages_present", r.pages_present)?;
    d.set_item("time_to_first_page", r.first_page_secs)?;
    d.set_item("total_secs", r.total_secs)?;
    d.set_item("resolve_secs", r.resolve_secs)?;
    d.set_item("pages_verified", r.pages_verified)?;
    d.set_item("repaired", r.repaired)?;
    d.set_item("failures", r.failures.clone())?;
    Ok(d)
}

/// A job record (`pagectl jobs`) as a dict of its fields.
pub fn record_dict<'py>(py: Python<'py>, r: &JobRecord) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("id", &r.id)?;
    d.set_item("source", &r.source)?;
    d.set_item("client", &r.client)?;
    d.set_item("state", load::job_state(r, load::unix_now()))?;
    d.set_item("verify", r.verify)?;
    d.set_item("submitted", r.submitted)?;
    d.set_item("updated", r.updated)?;
    d.set_item("elapsed_secs", r.elapsed_secs)?;
    d.set_item("resolve_secs", r.resolve_secs)?;
    d.set_item("time_to_first_page", r.first_page_secs)?;
    d.set_item("files_total", r.files_total)?;
    d.set_item("files_done", r.files_done)?;
    d.set_item("files_failed", r.files_failed)?;
    d.set_item("bytes_done", r.bytes_done)?;
    d.set_item("bytes_loaded", r.bytes_loaded)?;
    d.set_item("pages_loaded", r.pages_loaded)?;
    d.set_item("pages_present", r.pages_present)?;
    Ok(d)
}

#[pymethods]
impl PreloadJob {
    /// The job's id (as `pagectl jobs` lists it).
    #[getter]
    fn id(&self) -> &str {
        &self.id
    }

    /// Waits for the job (at most `timeout` seconds: `TimeoutError` after) and returns its
    /// report; raises what stopped it from listing its files. A file that failed to load does
    /// not raise: the report counts it (`failed`) and says why (`failures`).
    #[pyo3(signature = (timeout=None))]
    fn wait<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyDict>> {
        let p = process()?;
        if p.pid() != self.pid {
            return Err(PyRuntimeError::new_err(format!(
                "preload job {} runs in process {}, not in this one (a forked child); wait for \
                 it there, or follow it with jobs()",
                self.id, self.pid
            )));
        }
        let state = self.state.clone();
        let limit = timeout.map(|t| Duration::from_secs_f64(t.clamp(0.0, 1e9)));
        let (mut st, ended) = p.block_on(py, async move {
            let mut st = state.lock_owned().await;
            let ended = match &mut *st {
                JobState::Running(h) => match limit {
                    Some(l) => tokio::time::timeout(l, h).await.ok(),
                    None => Some(h.await),
                },
                JobState::Done(_) => None,
            };
            (st, ended)
        });
        if let Some(r) = ended {
            *st = JobState::Done(match r {
                Ok(Ok(rep)) => Ok(rep),
                Ok(Err(e)) => Err(load_to_py(e)),
                Err(e) => Err(PyRuntimeError::new_err(format!("the job ended: {e}"))),
            });
        }
        match &*st {
            JobState::Running(_) => Err(PyTimeoutError::new_err(format!(
                "preload job {} still running",
                self.id
            ))),
            JobState::Done(Ok(r)) => report_dict(py, &self.id, r),
            JobState::Done(Err(e)) => Err(e.clone_ref(py)),
        }
    }

    /// Whether the job has finished.
    fn done(&self, py: Python<'_>) -> PyResult<bool> {
        let state = self.state.clone();
        Ok(py.detach(move || match &*state.blocking_lock_owned() {
            JobState::Running(h) => h.is_finished(),
            JobState::Done(_) => true,
        }))
    }

    /// The job's record as the nodes keep it now (its progress), or None before the first.
    fn record<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let p = process()?;
        let client = self.client.clone();
        if p.pid() != self.pid {
            return Err(PyRuntimeError::new_err(
                "this job object belongs to the parent process: use jobs() here",
            ));
        }
        let records = p
            .block_on(py, async move { client.jobs().await })
            .map_err(crate::to_py)?;
        records
            .iter()
            .find(|r| r.id == self.id)
            .map(|r| record_dict(py, r))
            .transpose()
    }

    fn __repr__(&self) -> String {
        format!("PreloadJob({:?})", self.id)
    }
}
