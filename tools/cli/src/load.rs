//! Preload jobs (`pagectl load`, `pagestore.preload` in Python): resolve a manifest or a prefix to files, then ask each page's
//! owning shard to load it from the under storage. The CLI is the job's only coordinator:
//! nothing sits on the data path. It reports the job's progress to every node every two seconds
//! and at the end (a [`JobRecord`], see [`job_record`]); nodes only keep the records, for
//! `pagectl jobs` and `/v1/jobs`.

use std::{
    collections::{HashMap, VecDeque},
    io::IsTerminal,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use futures_util::{stream, StreamExt};
use pagestore_client::{ufs::ObjectInfo, Client, Error, JobRecord, JobState};
use pagestore_protocol::frame::{MAX_JOB_CLIENT_LEN, MAX_JOB_SOURCE_LEN};

/// How to run a job.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Load requests in flight at once, each naming many files grouped by owner shard
    /// ([`Client::load_many`]); with `verify`, files in flight at once.
    pub parallel: usize,
    /// Also check every page against the under storage and repair what differs.
    pub verify: bool,
    /// The job's id (reported to the nodes).
    pub id: String,
    /// What the job loads (`manifest FILE` or `prefix PATH`), for the record.
    pub source: String,
    /// Seconds since the Unix epoch when the job was submitted.
    pub submitted: f64,
    /// Show the progress on standard error (a bar on a terminal, a line every few seconds
    /// otherwise); off for callers that report it themselves.
    pub progress: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            parallel: 16,
            verify: false,
            id: new_job_id(),
            source: String::new(),
            submitted: unix_now(),
            progress: true,
        }
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Seconds without a report after which a running job counts as `lost` (its CLI died or
/// lost the network); the CLI reports every 2 s.
pub const LOST_AFTER_SECS: f64 = 30.0;

/// The state of a job record as shown to operators at time `now` (Unix seconds): its own
/// `state`, except that a `running` job that stopped reporting is `lost`.
pub fn job_state(record: &JobRecord, now: f64) -> &'static str {
    if record.state == JobState::Running && now - record.updated > LOST_AFTER_SECS {
        "lost"
    } else {
        record.state.as_str()
    }
}

/// A job id: the submission time and the process id, readable and unique enough per cluster.
pub fn new_job_id() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "load-{}-{:03}-{}",
        now.as_secs(),
        now.subsec_millis(),
        std::process::id()
    )
}

/// What a job did.
#[derive(Clone, Debug, Default)]
pub struct JobReport {
    /// Files in the job.
    pub files: u64,
    /// Files that failed (see `failures`).
    pub failed: u64,
    /// Pages loaded from the under storage by this job.
    pub pages_loaded: u64,
    /// Pages that were cached already.
    pub pages_present: u64,
    /// Bytes loaded.
    pub bytes_loaded: u64,
    /// Bytes of the files in the job.
    pub bytes_total: u64,
    /// Seconds from the job's submission ([`LoadOptions::submitted`]) to the first page cached
    /// (loaded or found present).
    pub first_page_secs: Option<f64>,
    /// Seconds from the job's submission to its end.
    pub total_secs: f64,
    /// Seconds from the job's submission until its files were resolved (a prefix walked, a
    /// manifest's directories listed), which happens while the first files load.
    pub resolve_secs: f64,
    /// With `verify`: pages compared with the under storage.
    pub pages_verified: u64,
    /// With `verify`: files whose cached version was stale, or whose pages differed, and were
    /// reloaded.
    pub repaired: u64,
    /// The first failures: (path, why).
    pub failures: Vec<(String, String)>,
}

/// Why a preload job could not list its files.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A manifest line is not a usable path.
    #[error("manifest line {line}: {why}")]
    Manifest {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        why: String,
    },
    /// The cluster could not list the prefix (no such path, unavailable, refused).
    #[error(transparent)]
    Cluster(#[from] Error),
    /// A directory under the prefix could not be listed.
    #[error("{dir}: {source}")]
    Listing {
        /// The directory.
        dir: String,
        /// Why.
        source: Error,
    },
}

/// Paths named by a manifest: one logical path per line, or JSON lines with a `path` field.
/// Blank lines and lines starting with `#` are skipped.
pub fn parse_manifest(text: &str) -> Result<Vec<String>, LoadError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let bad = |why| LoadError::Manifest { line: i + 1, why };
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let path = if line.starts_with('{') {
            let v: serde_json::Value =
                serde_json::from_str(line).map_err(|e| bad(format!("not JSON: {e}")))?;
            v.get("path")
                .and_then(|p| p.as_str())
                .ok_or_else(|| bad("no string field \"path\"".into()))?
                .to_string()
        } else {
            line.to_string()
        };
        if !path.starts_with('/') {
            return Err(bad(format!(
                "{path:?} is not an absolute logical path (e.g. /data/x.bin)"
            )));
        }
        out.push(path);
    }
    Ok(out)
}

/// A file a job loads, with what its directory's listing said of it (`None`: the job stats it
/// before loading it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The logical path.
    pub path: String,
    /// Size, version and file id from a listing (the same as a stat at that time).
    pub listed: Option<ObjectInfo>,
}

impl Target {
    /// A file known by its path only.
    pub fn path(path: String) -> Target {
        Target { path, listed: None }
    }
}

/// The path of entry `name` of directory `dir`.
fn child(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// The directory holding `path` (`/` for a top-level name).
fn parent(path: &str) -> &str {
    match path.rsplit_once('/') {
        Some(("", _)) | None => "/",
        Some((dir, _)) => dir,
    }
}

/// Where a job's resolved files go: the job's queue, with a tally of what was sent.
struct Found {
    tx: tokio::sync::mpsc::UnboundedSender<Vec<Target>>,
    tally: Arc<Tally>,
}

/// How many files were handed to a job, and whether that is all of them.
#[derive(Default)]
struct Tally {
    files: AtomicU64,
    done: AtomicBool,
}

impl Tally {
    /// A tally of `files` already complete (the files of a manifest are known from the start).
    fn complete(files: usize) -> Tally {
        Tally {
            files: AtomicU64::new(files as u64),
            done: AtomicBool::new(true),
        }
    }
}

impl Found {
    fn new(tx: tokio::sync::mpsc::UnboundedSender<Vec<Target>>, tally: Arc<Tally>) -> Found {
        Found { tx, tally }
    }

    fn send(&self, batch: Vec<Target>) {
        if !batch.is_empty() {
            self.tally
                .files
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            // The receiver gone means the job is gone: nothing is left to do either way.
            let _ = self.tx.send(batch);
        }
    }
}

impl Drop for Found {
    fn drop(&mut self) {
        // Nothing more can be sent: the tally is final.
        self.tally.done.store(true, Ordering::Relaxed);
    }
}

/// Directories a walk lists at once.
const WALK_LISTINGS: usize = 16;

/// `prefix` as the directory (or file) a walk starts from.
fn walk_root(prefix: &str) -> String {
    match prefix.trim_end_matches('/') {
        "" => "/".to_string(),
        p => p.to_string(),
    }
}

/// Lists directory `dir` a page at a time, sending each page's files to `found` as the page
/// comes, each with what the listing says of it (so the job stats nothing; an entry without a
/// version is stat'ed when it is loaded). `on_page` is called as each page arrives. Returns
/// the subdirectories, and how the listing ended.
async fn list_dir(
    client: &Client,
    dir: &str,
    found: &Found,
    mut on_page: impl FnMut(),
) -> (Vec<String>, Result<(), Error>) {
    let mut subdirs = Vec::new();
    let r = client
        .list_pages(dir, |page| {
            on_page();
            let mut batch = Vec::with_capacity(page.len());
            for e in page {
                let path = child(dir, &e.name);
                if e.is_dir {
                    subdirs.push(path);
                } else {
                    let listed = ObjectInfo::listed(path.clone(), e);
                    batch.push(Target { path, listed });
                }
            }
            found.send(batch);
        })
        .await;
    (subdirs, r)
}

/// Sends every file under `root` to `found` (`root` itself where it names a file), listing
/// [`WALK_LISTINGS`] directories at once and each a page at a time, so that the first files
/// go out while the rest are listed. `opened`, if given, is told as soon as the root's first
/// page came or its listing ended: `None`, or the root's error where its listing failed before
/// giving anything (no such path, refused), which is then not among the failures. Returns the
/// directories that could not be listed, with why.
async fn walk_into(
    client: &Client,
    root: &str,
    found: &Found,
    mut opened: Option<tokio::sync::oneshot::Sender<Option<Error>>>,
) -> Vec<(String, Error)> {
    let mut failures = Vec::new();
    let (subdirs, r) = list_dir(client, root, found, || {
        if let Some(o) = opened.take() {
            let _ = o.send(None);
        }
    })
    .await;
    match r {
        Ok(()) => {}
        Err(Error::NotDir(_)) => found.send(vec![Target::path(root.to_string())]),
        Err(e) => match opened.take() {
            Some(o) => {
                let _ = o.send(Some(e));
                return failures;
            }
            None => failures.push((root.to_string(), e)),
        },
    }
    if let Some(o) = opened.take() {
        let _ = o.send(None);
    }
    let mut queue: VecDeque<String> = subdirs.into();
    let mut listing = futures_util::stream::FuturesUnordered::new();
    loop {
        while listing.len() < WALK_LISTINGS {
            let Some(dir) = queue.pop_front() else { break };
            listing.push(async move {
                let (subdirs, r) = list_dir(client, &dir, found, || {}).await;
                (dir, subdirs, r)
            });
        }
        let Some((dir, subdirs, r)) = listing.next().await else {
            break;
        };
        queue.extend(subdirs);
        if let Err(e) = r {
            failures.push((dir, e));
        }
    }
    failures
}

/// Every file under `prefix` (a directory, or one file), sorted by path, each with what its
/// directory's listing said of it, so that a job stats nothing. A directory that cannot be
/// listed fails the whole walk.
pub async fn walk(client: &Client, prefix: &str) -> Result<Vec<Target>, LoadError> {
    let root = walk_root(prefix);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let found = Found::new(tx, Arc::default());
    let failures = walk_into(client, &root, &found, None).await;
    drop(found);
    if let Some((dir, source)) = failures.into_iter().next() {
        return Err(if dir == root {
            LoadError::Cluster(source)
        } else {
            LoadError::Listing { dir, source }
        });
    }
    let mut files = Vec::new();
    while let Ok(batch) = rx.try_recv() {
        files.extend(batch);
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// The files under `prefix` (a directory, or one file) as a job's, listed while the job loads
/// them: the walk starts here, on a task of its own, and this returns as soon as the prefix's
/// first listing page came, so that a prefix that cannot be listed (no such path, refused) is
/// an error before any job starts. A directory below it that cannot be listed fails the job
/// (after everything else loaded), named in its failures.
pub async fn prefix_files(client: &Arc<Client>, prefix: &str) -> Result<JobFiles, LoadError> {
    let root = walk_root(prefix);
    let (tx, batches) = tokio::sync::mpsc::unbounded_channel();
    let tally = Arc::new(Tally::default());
    let found = Found::new(tx, tally.clone());
    let (opened_tx, opened) = tokio::sync::oneshot::channel();
    let c = client.clone();
    let task = tokio::spawn(async move {
        let failures = walk_into(&c, &root, &found, Some(opened_tx)).await;
        drop(found);
        (failures, Instant::now())
    });
    match opened.await {
        Ok(None) => Ok(JobFiles::Prefix(Walk {
            batches,
            tally,
            task,
        })),
        Ok(Some(e)) => Err(LoadError::Cluster(e)),
        Err(_) => Err(LoadError::Cluster(Error::unavailable(format!(
            "{prefix}: the listing stopped before its first page"
        )))),
    }
}

/// A manifest's files are looked up in one listing of their directory where the manifest names
/// at least this many files of it (else each is stat'ed: listing a large directory for a few of
/// its files would cost more than their stats).
pub const LIST_FROM: usize = 16;

/// A manifest of at least this many files starts loading its first [`HEAD_START`] files at
/// once, each stat'ed, while the directories of the rest are listed: a store lists a directory
/// of 10,000 files in tens of milliseconds, and of 100,000 in about a second, before the first
/// entry comes back.
pub const HEAD_START_FROM: usize = 1000;

/// See [`HEAD_START_FROM`]. Fewer than the stats after which a node lists the directory of the
/// files asked about (`pagestore_server::loader::LIST_AFTER_STATS`, 16; the cluster tests
/// check it), so that these stats do not make a node list it as well.
pub const HEAD_START: usize = 8;

/// The files of a job: all known before it starts, the paths of a manifest, looked up while
/// the job runs ([`resolve_manifest`]), or the files under a prefix, listed while the job runs
/// ([`prefix_files`]).
pub enum JobFiles {
    /// Files already resolved.
    Known(Vec<Target>),
    /// A manifest's paths.
    Manifest(Vec<String>),
    /// A prefix being walked.
    Prefix(Walk),
}

/// A prefix's walk under way ([`prefix_files`]): its files as they are listed, and the task
/// listing them, which ends with the directories that could not be listed and when it ended.
pub struct Walk {
    batches: tokio::sync::mpsc::UnboundedReceiver<Vec<Target>>,
    tally: Arc<Tally>,
    task: tokio::task::JoinHandle<(Vec<(String, Error)>, Instant)>,
}

/// The files of a manifest, sent to `found` in batches as they are resolved, each with what its
/// directory's listing says of it where the manifest names at least [`LIST_FROM`] files of that
/// directory, so that a job of many small files asks one listing per directory instead of a
/// stat per file. A listing's files are sent page by page as the listing comes, so the job
/// loads the first while the rest are listed; a large manifest's first [`HEAD_START`] files go
/// first, unlisted ([`HEAD_START_FROM`]). A file the listing does not hold, or one of a
/// directory that cannot be listed, is sent unlisted, for its stat (which then says what is
/// wrong). Every path of `paths` is sent exactly once (a path named twice, twice).
async fn resolve_manifest(client: &Client, mut paths: Vec<String>, found: &Found) {
    let send = |batch: Vec<Target>| found.send(batch);
    if paths.len() >= HEAD_START_FROM {
        send(paths.drain(..HEAD_START).map(Target::path).collect());
    }
    // Per directory, the names wanted in it and the manifest's paths of each.
    let mut per_dir: HashMap<String, HashMap<String, Vec<String>>> = HashMap::new();
    for p in paths {
        let name = p.rsplit_once('/').map_or("", |(_, n)| n).to_string();
        per_dir
            .entry(parent(&p).to_string())
            .or_default()
            .entry(name)
            .or_default()
            .push(p);
    }
    let (listed, few): (Vec<_>, Vec<_>) = per_dir
        .into_iter()
        .partition(|(_, names)| names.values().map(Vec::len).sum::<usize>() >= LIST_FROM);
    send(
        few.into_iter()
            .flat_map(|(_, names)| names.into_values().flatten())
            .map(Target::path)
            .collect(),
    );
    stream::iter(listed)
        .for_each_concurrent(16, |(dir, mut wanted)| async move {
            // Whatever the listing's outcome, what it did not describe is stat'ed.
            let _ = client
                .list_pages(&dir, |page| {
                    let mut batch = Vec::new();
                    for e in page {
                        for path in wanted.remove(&e.name).into_iter().flatten() {
                            let listed = ObjectInfo::listed(path.clone(), e);
                            batch.push(Target { path, listed });
                        }
                    }
                    send(batch);
                })
                .await;
            send(wanted.into_values().flatten().map(Target::path).collect());
        })
        .await;
}

struct Progress {
    files_done: AtomicU64,
    bytes_done: AtomicU64,
    bytes_loaded: AtomicU64,
    pages_loaded: AtomicU64,
    pages_present: AtomicU64,
    failed: AtomicU64,
    first_page: Mutex<Option<f64>>,
    /// The files handed to the job so far, and whether that is all of them.
    total: Arc<Tally>,
}

impl Progress {
    /// The job's files so far, and whether that is all of them (a prefix's walk may go on).
    fn total(&self) -> (u64, bool) {
        let done = self.total.done.load(Ordering::Relaxed);
        (self.total.files.load(Ordering::Relaxed), done)
    }
}

/// The progress record of a job as nodes keep it (`pagectl jobs`, `/v1/jobs`). `state`:
/// running, done or failed (some files failed). The source and client names are cut to the
/// record's limits, so that the nodes take it.
fn job_record(opts: &LoadOptions, p: &Progress, started: f64, state: JobState) -> JobRecord {
    let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let first = *p.first_page.lock().unwrap_or_else(|e| e.into_inner());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let updated = unix_now();
    JobRecord {
        id: opts.id.clone(),
        source: clipped(&opts.source, MAX_JOB_SOURCE_LEN),
        client: clipped(
            &format!("{host}:{}", std::process::id()),
            MAX_JOB_CLIENT_LEN,
        ),
        state,
        verify: opts.verify,
        submitted: opts.submitted,
        updated,
        elapsed_secs: updated - opts.submitted,
        resolve_secs: started - opts.submitted,
        first_page_secs: first.map(|f| f + started - opts.submitted),
        files_total: p.total().0,
        files_done: g(&p.files_done),
        files_failed: g(&p.failed),
        bytes_done: g(&p.bytes_done),
        bytes_loaded: g(&p.bytes_loaded),
        pages_loaded: g(&p.pages_loaded),
        pages_present: g(&p.pages_present),
    }
}

/// `text` cut to at most `max` bytes, at a character boundary.
fn clipped(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Loads every file of `files` (see the module docs), printing progress to standard error
/// (with [`LoadOptions::progress`]): a line rewritten in place on a terminal, a plain line every
/// few seconds otherwise.
pub async fn run_job(client: Arc<Client>, files: JobFiles, opts: &LoadOptions) -> JobReport {
    let start = Instant::now();
    let started = unix_now();
    // The time between the submission and now (reading a manifest, a prefix's first listing
    // page) counts in the report.
    let before = (started - opts.submitted).max(0.0);
    // The files come in batches as they are resolved, and load as they come. A manifest is
    // resolved on a task of its own (grouping a large manifest's paths takes a while, and the
    // loading must not wait for it); a prefix's walk is under way already.
    let (batches, total, resolving) = match files {
        JobFiles::Known(v) => {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let total = Arc::new(Tally::default());
            Found::new(tx, total.clone()).send(v);
            (rx, total, None)
        }
        JobFiles::Manifest(paths) => {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let total = Arc::new(Tally::complete(paths.len()));
            let found = Found::new(tx, Arc::default());
            let client = client.clone();
            let task = tokio::spawn(async move {
                resolve_manifest(&client, paths, &found).await;
                // `found` is dropped here: the loading ends with the last batch.
                drop(found);
                (Vec::new(), Instant::now())
            });
            (rx, total, Some(task))
        }
        JobFiles::Prefix(walk) => (walk.batches, walk.tally, Some(walk.task)),
    };
    let progress = Arc::new(Progress {
        files_done: AtomicU64::new(0),
        bytes_done: AtomicU64::new(0),
        bytes_loaded: AtomicU64::new(0),
        pages_loaded: AtomicU64::new(0),
        pages_present: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        first_page: Mutex::new(None),
        total,
    });
    // The first record goes out while the loading starts (it is awaited before the last one,
    // so that a node never keeps "running" after "done").
    let first = job_record(opts, &progress, started, JobState::Running);
    let first = {
        let client = client.clone();
        tokio::spawn(async move {
            if client.report_job(&first).await == 0 {
                tracing::warn!(
                    "no node keeps this job's record (adding one needs the writer role; see \
                     docs/SECURITY.md); loading anyway"
                );
            }
        })
    };
    let out = ProgressOut::new(progress.total().0, opts.progress);
    let ticker = spawn_ticker(&progress, &client, opts, &out, start, started);
    let report = Arc::new(Mutex::new(JobReport::default()));
    let loading = async {
        if opts.verify {
            // File by file: each is checked against the under storage page by page.
            let files = stream::unfold(batches, |mut b| async move {
                b.recv().await.map(|batch| (stream::iter(batch), b))
            })
            .flatten();
            files
                .for_each_concurrent(opts.parallel.max(1), |file| {
                    let (client, progress, report) =
                        (client.clone(), progress.clone(), report.clone());
                    async move {
                        let r = load_one(&client, &file, opts.verify).await;
                        let mut rep = report.lock().unwrap_or_else(|p| p.into_inner());
                        count_file(r, &file.path, &progress, &mut rep, start);
                        progress.files_done.fetch_add(1, Ordering::Relaxed);
                    }
                })
                .await;
        } else {
            // Whatever came while the last batch loaded loads next, as one batch.
            let mut batches = batches;
            while let Some(mut batch) = batches.recv().await {
                while let Ok(more) = batches.try_recv() {
                    batch.extend(more);
                }
                load_batched(&client, batch, opts, &progress, &report, start).await;
            }
        }
    };
    loading.await;
    // The resolving task's end: the directories it could not list, and when it ended. One that
    // died (a panic) may not have handed over every file, and the count would not show it.
    let (unlisted, resolved, died) = match resolving {
        Some(task) => match task.await {
            Ok((unlisted, at)) => (unlisted, at, None),
            Err(e) => (Vec::new(), Instant::now(), Some(e.to_string())),
        },
        None => (Vec::new(), start, None),
    };
    {
        let mut rep = report.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(why) = died {
            progress.failed.fetch_add(1, Ordering::Relaxed);
            rep.failures.push((
                opts.source.clone(),
                format!("resolving the job's files stopped: {why}"),
            ));
        }
        // A directory that could not be listed fails the job: its files are unknown.
        for (dir, e) in unlisted {
            progress.failed.fetch_add(1, Ordering::Relaxed);
            if rep.failures.len() < 20 {
                rep.failures.push((dir, format!("cannot be listed: {e}")));
            }
        }
        // Every file is counted, loaded or failed: one the resolving never handed over (it
        // cannot, short of a panic) fails the job rather than passing unseen.
        let unseen = progress
            .total()
            .0
            .saturating_sub(progress.files_done.load(Ordering::Relaxed));
        if unseen > 0 {
            progress.failed.fetch_add(unseen, Ordering::Relaxed);
            rep.failures.push((
                opts.source.clone(),
                format!("{unseen} files were never resolved"),
            ));
        }
    }
    ticker.abort();
    let _ = first.await;
    let state = if progress.failed.load(Ordering::Relaxed) > 0 {
        JobState::Failed
    } else {
        JobState::Done
    };
    let record = job_record(opts, &progress, started, state);
    if client.report_job(&record).await == 0 {
        tracing::warn!("no node took the job's final record");
    }
    out.show(&progress, start, true);
    let mut r = final_report(&report, &progress, start);
    r.first_page_secs = r.first_page_secs.map(|f| f + before);
    r.total_secs += before;
    r.resolve_secs = before + resolved.saturating_duration_since(start).as_secs_f64();
    r
}

/// Every 250 ms shows the progress (every 5 s without a terminal) and, every 2 s, reports
/// the job's record to the cluster; runs until aborted.
fn spawn_ticker(
    progress: &Arc<Progress>,
    client: &Arc<Client>,
    opts: &LoadOptions,
    out: &ProgressOut,
    start: Instant,
    started: f64,
) -> tokio::task::JoinHandle<()> {
    let (progress, client, opts) = (progress.clone(), client.clone(), opts.clone());
    let (out, tty) = (out.clone(), out.bar.is_some());
    tokio::spawn(async move {
        let every = Duration::from_millis(250);
        let print_every = if tty { 1 } else { 20 };
        let mut tick: u64 = 0;
        loop {
            tokio::time::sleep(every).await;
            tick += 1;
            if tick % print_every == 0 {
                out.show(&progress, start, false);
            }
            if tick % 8 == 0 {
                let r = job_record(&opts, &progress, started, JobState::Running);
                client.report_job(&r).await;
            }
        }
    })
}

/// Adds one file's outcome to the counters and the report.
fn count_file(
    r: Result<OneFile, String>,
    path: &str,
    progress: &Progress,
    rep: &mut JobReport,
    start: Instant,
) {
    match r {
        Ok(one) => {
            if one.loaded + one.present > 0 {
                let mut f = progress
                    .first_page
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                f.get_or_insert(start.elapsed().as_secs_f64());
            }
            progress
                .pages_loaded
                .fetch_add(one.loaded, Ordering::Relaxed);
            progress
                .pages_present
                .fetch_add(one.present, Ordering::Relaxed);
            progress
                .bytes_loaded
                .fetch_add(one.bytes, Ordering::Relaxed);
            rep.pages_verified += one.verified;
            rep.repaired += u64::from(one.repaired);
            progress.bytes_done.fetch_add(one.size, Ordering::Relaxed);
        }
        Err(e) => {
            progress.failed.fetch_add(1, Ordering::Relaxed);
            if rep.failures.len() < 20 {
                rep.failures.push((path.to_string(), e));
            }
        }
    }
}

/// The report, with the counters copied from `progress`.
fn final_report(report: &Mutex<JobReport>, progress: &Progress, start: Instant) -> JobReport {
    // The counters live in `progress` (the ticker and the records read them); the report
    // copies them once at the end.
    let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let mut rep = report.lock().unwrap_or_else(|p| p.into_inner()).clone();
    rep.files = progress.total().0;
    rep.failed = g(&progress.failed);
    rep.pages_loaded = g(&progress.pages_loaded);
    rep.pages_present = g(&progress.pages_present);
    rep.bytes_loaded = g(&progress.bytes_loaded);
    rep.bytes_total = g(&progress.bytes_done);
    rep.total_secs = start.elapsed().as_secs_f64();
    rep.first_page_secs = *progress
        .first_page
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    rep
}

/// Where progress goes: a bar redrawn in place on a terminal (indicatif), otherwise a plain
/// line every few seconds (logs and pipes keep every line).
#[derive(Clone)]
struct ProgressOut {
    shown: bool,
    bar: Option<indicatif::ProgressBar>,
}

impl ProgressOut {
    fn new(total: u64, shown: bool) -> ProgressOut {
        if !shown || !std::io::stderr().is_terminal() {
            return ProgressOut { shown, bar: None };
        }
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(total),
            indicatif::ProgressDrawTarget::stderr(),
        );
        // A fixed template: the only way it fails is a typo here, and then the default does.
        if let Ok(style) =
            indicatif::ProgressStyle::with_template("{bar:30} files {pos}/{len}  {msg}  ETA {eta}")
        {
            bar.set_style(style);
        }
        ProgressOut {
            shown,
            bar: Some(bar),
        }
    }

    fn show(&self, p: &Progress, start: Instant, last: bool) {
        if !self.shown {
            return;
        }
        // While a prefix is walked, the total is what was listed so far.
        let (total, complete) = p.total();
        let more = if complete { "" } else { "+" };
        let done = p.files_done.load(Ordering::Relaxed);
        let bytes = p.bytes_done.load(Ordering::Relaxed);
        let rate = bytes as f64 / start.elapsed().as_secs_f64().max(1e-3);
        let failed = p.failed.load(Ordering::Relaxed);
        let amounts = format!(
            "{}{:.1} MB  {:.1} MB/s  failed {failed}",
            if complete { "" } else { "(listing) " },
            bytes as f64 / 1e6,
            rate / 1e6
        );
        match &self.bar {
            Some(bar) => {
                bar.set_length(total);
                bar.set_position(done);
                bar.set_message(amounts);
                if last {
                    bar.finish();
                }
            }
            None => {
                let secs = start.elapsed().as_secs_f64().max(1e-3);
                let eta = if complete && done > 0 && done < total {
                    format!("{:.0}s", secs * (total - done) as f64 / done as f64)
                } else {
                    "-".into()
                };
                let (mb, mbs) = (bytes as f64 / 1e6, rate / 1e6);
                eprintln!(
                    "files {done}/{total}{more}  {mb:.1} MB  {mbs:.1} MB/s  ETA {eta}  failed \
                     {failed}"
                );
            }
        }
    }
}

/// Loads `files` in batches ([`Client::load_many`]: many files per request, grouped by
/// owner shard, at most `opts.parallel` requests in flight): those a listing described at
/// once, the others after a stat each (made meanwhile); every file's outcome is counted as it
/// completes.
async fn load_batched(
    client: &Client,
    files: Vec<Target>,
    opts: &LoadOptions,
    progress: &Progress,
    report: &Mutex<JobReport>,
    start: Instant,
) {
    let finish = |path: &str, r: Result<OneFile, String>| {
        let mut rep = report.lock().unwrap_or_else(|p| p.into_inner());
        count_file(r, path, progress, &mut rep, start);
        progress.files_done.fetch_add(1, Ordering::Relaxed);
    };
    // The files a listing described load at once; the others are stat'ed meanwhile, and load
    // after.
    let (listed, unlisted): (Vec<Target>, Vec<Target>) =
        files.into_iter().partition(|t| t.listed.is_some());
    let listed: Vec<ObjectInfo> = listed.into_iter().filter_map(|t| t.listed).collect();
    let stat_then_load = async {
        let stats: Vec<(String, Result<ObjectInfo, Error>)> = stream::iter(unlisted)
            .map(|t| async move {
                let r = client.stat(&t.path).await;
                (t.path, r)
            })
            .buffered(opts.parallel.max(1))
            .collect()
            .await;
        let mut infos = Vec::with_capacity(stats.len());
        for (path, r) in stats {
            match r {
                Ok(info) => infos.push(info),
                Err(e) => finish(&path, Err(e.to_string())),
            }
        }
        load_infos(client, &infos, opts, &finish).await;
    };
    futures_util::future::join(load_infos(client, &listed, opts, &finish), stat_then_load).await;
}

/// [`Client::load_many`] of `infos`, each file's outcome handed to `finish`.
async fn load_infos(
    client: &Client,
    infos: &[ObjectInfo],
    opts: &LoadOptions,
    finish: &impl Fn(&str, Result<OneFile, String>),
) {
    if infos.is_empty() {
        return;
    }
    client
        .load_many(infos, opts.parallel.max(1), |i, r| {
            let info = &infos[i];
            let one = r.map(|o| OneFile {
                size: info.size,
                loaded: o.loaded,
                present: o.present,
                bytes: o.bytes,
                verified: 0,
                repaired: false,
            });
            finish(&info.path, one.map_err(|e| e.to_string()));
        })
        .await;
}

struct OneFile {
    size: u64,
    loaded: u64,
    present: u64,
    bytes: u64,
    verified: u64,
    repaired: bool,
}

async fn load_one(client: &Client, file: &Target, verify: bool) -> Result<OneFile, String> {
    let path = file.path.as_str();
    let mut info = match &file.listed {
        Some(info) => info.clone(),
        None => client.stat(path).await.map_err(|e| e.to_string())?,
    };
    let mut repaired = false;
    if verify {
        // The cluster's metadata must name the version the under storage holds now.
        if let Some(ufs) = client.ufs_table() {
            let now = ufs.stat(path).await.map_err(|e| e.to_string())?;
            if now.version != info.version {
                client.invalidate(path, Some(info.file_id)).await;
                info = now;
                repaired = true;
            }
        }
    }
    let out = client.load(&info).await.map_err(|e| e.to_string())?;
    let mut verified = 0;
    if verify {
        let ufs = client.ufs_table().ok_or(
            "--verify needs to read the under storage directly (for S3 mounts: credentials in \
             this environment)",
        )?;
        let ps = u64::from(client.page_size());
        for p in 0..info.size.div_ceil(ps) {
            let cached = client
                .read_page(&info, p, 0, ps as u32)
                .await
                .map_err(|e| e.to_string())?;
            let start = p * ps;
            let source = ufs
                .read(&info, start..(start + ps).min(info.size))
                .await
                .map_err(|e| e.to_string())?;
            verified += 1;
            if cached != source {
                client.invalidate(path, Some(info.file_id)).await;
                client.load(&info).await.map_err(|e| e.to_string())?;
                repaired = true;
                break;
            }
        }
    }
    Ok(OneFile {
        size: info.size,
        loaded: out.loaded,
        present: out.present,
        bytes: out.bytes,
        verified,
        repaired,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_directory_and_entry() {
        assert_eq!(parent("/data/a/x.bin"), "/data/a");
        assert_eq!(parent("/top"), "/");
        assert_eq!(child("/", "top"), "/top");
        assert_eq!(child("/data/a", "x.bin"), "/data/a/x.bin");
        for p in ["/data/a/x.bin", "/top"] {
            let (dir, name) = p.rsplit_once('/').unwrap();
            assert_eq!(child(parent(p), name), p, "{dir}");
        }
    }

    #[test]
    fn manifests_take_plain_and_json_lines() {
        let m = "# comment\n/data/a\n\n{\"path\": \"/data/b\", \"size\": 3}\n  /data/c  \n";
        assert_eq!(
            parse_manifest(m).unwrap(),
            vec!["/data/a", "/data/b", "/data/c"]
        );
        assert!(parse_manifest("relative/path")
            .unwrap_err()
            .to_string()
            .contains("line 1"));
        assert!(parse_manifest("/a\n{\"nopath\": 1}")
            .unwrap_err()
            .to_string()
            .contains("line 2"));
        assert!(parse_manifest("{not json")
            .unwrap_err()
            .to_string()
            .contains("not JSON"));
    }

    #[test]
    fn what_a_walk_hands_over_is_tallied_and_final_once_it_ends() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let tally = Arc::new(Tally::default());
        let found = Found::new(tx, tally.clone());
        found.send(vec![
            Target::path("/m/a".into()),
            Target::path("/m/b".into()),
        ]);
        // An empty page sends nothing.
        found.send(Vec::new());
        found.send(vec![Target::path("/m/c".into())]);
        assert_eq!(tally.files.load(Ordering::Relaxed), 3);
        assert!(!tally.done.load(Ordering::Relaxed), "the walk goes on");
        drop(found);
        assert!(tally.done.load(Ordering::Relaxed));
        let sizes: Vec<usize> =
            std::iter::from_fn(|| rx.try_recv().ok().map(|b| b.len())).collect();
        assert_eq!(sizes, [2, 1]);
    }

    #[test]
    fn records_fit_their_limits_and_silent_running_jobs_are_lost() {
        let opts = LoadOptions {
            source: format!("manifest /{}", "é".repeat(MAX_JOB_SOURCE_LEN)),
            ..LoadOptions::default()
        };
        let p = Progress {
            files_done: AtomicU64::new(2),
            bytes_done: AtomicU64::new(3),
            bytes_loaded: AtomicU64::new(4),
            pages_loaded: AtomicU64::new(5),
            pages_present: AtomicU64::new(6),
            failed: AtomicU64::new(1),
            first_page: Mutex::new(Some(0.5)),
            total: Arc::new(Tally::complete(9)),
        };
        let r = job_record(&opts, &p, opts.submitted + 1.0, JobState::Running);
        assert!(r.source.len() <= MAX_JOB_SOURCE_LEN && r.source.starts_with("manifest /é"));
        assert_eq!(
            (r.files_total, r.files_done, r.files_failed, r.bytes_done),
            (9, 2, 1, 3)
        );
        assert_eq!((r.bytes_loaded, r.pages_loaded, r.pages_present), (4, 5, 6));
        assert_eq!(r.first_page_secs, Some(1.5));
        assert!(pagestore_protocol::frame::encode_job_record(&r).is_ok());
        assert_eq!(job_state(&r, r.updated + 1.0), "running");
        assert_eq!(job_state(&r, r.updated + LOST_AFTER_SECS + 1.0), "lost");
        let done = JobRecord {
            state: JobState::Done,
            ..r
        };
        assert_eq!(
            job_state(&done, done.updated + LOST_AFTER_SECS + 1.0),
            "done"
        );
    }
}
