//! The file system behind `pagefs`: pagestore's logical namespace through FUSE, read-only
//! except where a mount takes writes from this machine.
//!
//! - Inodes: one number per logical path, handed out on first sight (lookup, readdir or
//!   create) and kept for the life of the mount (numbers are never reused, so the generation
//!   is always 0). A rename moves the number to the new path; an unlink forgets the path.
//! - Attributes: from `Client::stat_path` or from a directory listing; the kernel caches them,
//!   and the entries, for the attribute TTL, and so does this table (a lookup right after a
//!   readdir costs no request). A file's mtime and ctime are the object's modification time in
//!   the store; a directory made through the cluster shows its own time (when it was made, or
//!   set since: `touch`, `cp -a`), any other directory (object stores have none) the mount's
//!   start time. A directory's time does not change with the entries made in it. A
//!   file open for writing here answers with its writer's size and time, never cached by the
//!   kernel (TTL 0).
//! - `statfs` (`df`) reports the cluster's cache: its capacity and the bytes cached, summed
//!   over the shards that answer (asked at most every [`STATFS_TTL`]); inode counts are 0,
//!   unknown.
//! - Open pins the object's version (`ObjectInfo`); every read of that handle is a
//!   `Client::read_at` of that version, so a handle never mixes versions. A read that comes back
//!   shorter than the pinned size promises is an error (ESTALE), never a silent short read.
//! - Writes (the `write` module): a path of a `write=back` or `write=transient` mount is written
//!   through the cluster (`Client::create`, `Writer`); one of a `write=through` mount whose
//!   store this machine can write is staged in a local file and sent to the store at fsync and
//!   close; any other path is read-only (EROFS). fsync and close(2) make what was written
//!   durable and visible to every reader (errors are answered there); the last release closes
//!   the file for good. Renames stay within a mount (EXDEV otherwise, and for directories, so
//!   that `mv` copies); unlink, mkdir and rmdir go to the cluster (or the store).
//! - Directories are listed once at opendir; readdir serves that snapshot by offset, so a long
//!   directory read over many readdir calls is consistent.
//! - Concurrency: the FUSE threads only look things up in memory; every request that needs the
//!   network runs as a task on the tokio runtime and replies from there. No lock is held across
//!   network I/O, so one slow read never holds up another request (a file's writes wait for
//!   one another, and for its fsync).

mod write;

use std::{
    collections::{HashMap, HashSet, VecDeque},
    ffi::OsStr,
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex, MutexGuard, OnceLock,
    },
    time::{Duration, Instant, SystemTime},
};

use bytes::{Bytes, BytesMut};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, Notifier, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};
use futures_util::future::{BoxFuture, FutureExt, Shared as SharedFuture};
use pagestore_client::{
    ufs::{system_time, unix_ns_of, MountTable, ObjectInfo},
    Client, Error, ReadRun,
};
use pagestore_protocol::frame::{FileState, PathKind};
use tracing::{debug, info, warn};
use write::{Start, WriteFile, Writes};

/// Settings of one mount.
#[derive(Clone, Debug)]
pub struct FsOptions {
    /// How long the kernel (and this table) may use an attribute or a name lookup before asking
    /// again. Zero asks every time.
    pub attr_ttl: Duration,
    /// Read-ahead asked of the kernel at the FUSE handshake (the kernel caps it at what it
    /// offers; raise the mount's `read_ahead_kb` in sysfs for more).
    pub readahead: u32,
    /// Asynchronous (read-ahead) requests the kernel may have in flight to us.
    pub max_background: u16,
    /// Refuse every write (EROFS), whatever the mounts take.
    pub read_only: bool,
    /// Where files written to `write=through` mounts are staged until fsync or close sends
    /// them to the store.
    pub staging_dir: PathBuf,
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            attr_ttl: Duration::from_secs(10),
            readahead: 8 << 20,
            max_background: 64,
            read_only: false,
            staging_dir: std::env::temp_dir().join("pagefs-staging"),
        }
    }
}

/// What a path is, as far as attributes go: a directory, or a file's size and modification
/// time (nanoseconds since the Unix epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A directory, with its modification time where the cluster keeps one (0: none known).
    Dir(i64),
    File(u64, i64),
}

impl From<&PathKind> for Kind {
    fn from(k: &PathKind) -> Kind {
        match k {
            PathKind::Dir { mtime_ns } => Kind::Dir(*mtime_ns),
            PathKind::File { size, mtime_ns, .. } => Kind::File(*size, *mtime_ns),
        }
    }
}

/// How long a `statfs` answer is reused before the shards are asked again.
pub const STATFS_TTL: Duration = Duration::from_secs(2);

/// Fragment size `statfs` counts blocks in.
const STATFS_FRAGMENT: u32 = 4096;

struct Node {
    path: Arc<str>,
    /// The last kind and size learned (stat or listing), and when.
    seen: Option<(Kind, Instant)>,
    /// The version (file id, size, mtime) the last open of this inode pinned, if the kernel
    /// may keep its cached pages for the next open of that version.
    opened: Option<Version>,
    /// The versions open for reading through this inode.
    readers: Vec<Readers>,
}

/// The descriptors reading one version of a file through its inode, either all through the
/// kernel's cache or all past it (direct).
struct Readers {
    version: Version,
    direct: bool,
    count: u32,
}

/// A file's version as an open pins it: file id, size, modification time.
type Version = (u128, u64, i64);

fn version_of(info: &ObjectInfo) -> Version {
    (info.file_id, info.size, info.mtime_ns)
}

impl Node {
    /// Counts a descriptor opened to read `version`. Returns whether the kernel may keep its
    /// cached pages (the last open was of this version) and whether it reads past the cache
    /// (another version is open for reading).
    fn open_reader(&mut self, version: Version) -> (bool, bool) {
        let direct = self.readers.iter().any(|r| r.version != version);
        match self
            .readers
            .iter_mut()
            .find(|r| r.version == version && r.direct == direct)
        {
            Some(r) => r.count += 1,
            None => self.readers.push(Readers {
                version,
                direct,
                count: 1,
            }),
        }
        let last = if direct {
            self.opened.take()
        } else {
            self.opened.replace(version)
        };
        (!direct && last == Some(version), direct)
    }

    /// A descriptor [`Node::open_reader`] counted was closed.
    fn close_reader(&mut self, version: Version, direct: bool) {
        let mine = |r: &Readers| r.version == version && r.direct == direct;
        if let Some(i) = self.readers.iter().position(mine) {
            self.readers[i].count -= 1;
            if self.readers[i].count == 0 {
                self.readers.swap_remove(i);
            }
        }
    }
}

/// Path <-> inode number; inode `n` is `nodes[n - 1]`, the root is 1.
struct Inodes {
    by_path: HashMap<Arc<str>, u64>,
    nodes: Vec<Node>,
}

impl Inodes {
    fn new() -> Inodes {
        let root: Arc<str> = Arc::from("/");
        Inodes {
            by_path: HashMap::from([(root.clone(), 1)]),
            nodes: vec![Node {
                path: root,
                seen: None,
                opened: None,
                readers: Vec::new(),
            }],
        }
    }

    fn node(&mut self, ino: u64) -> Option<&mut Node> {
        let i = usize::try_from(ino.checked_sub(1)?).ok()?;
        self.nodes.get_mut(i)
    }

    fn path(&mut self, ino: u64) -> Option<Arc<str>> {
        self.node(ino).map(|n| n.path.clone())
    }

    /// The inode of `path`, made on first sight.
    fn intern(&mut self, path: &str) -> u64 {
        if let Some(&ino) = self.by_path.get(path) {
            return ino;
        }
        let path: Arc<str> = Arc::from(path);
        self.nodes.push(Node {
            path: path.clone(),
            seen: None,
            opened: None,
            readers: Vec::new(),
        });
        let ino = self.nodes.len() as u64;
        self.by_path.insert(path, ino);
        ino
    }

    /// Interns `path` and records what it is.
    fn note(&mut self, path: &str, kind: Kind, now: Instant) -> u64 {
        let ino = self.intern(path);
        if let Some(n) = self.node(ino) {
            n.seen = Some((kind, now));
        }
        ino
    }

    /// The recorded kind of `ino` if younger than `ttl`, with the time it has left.
    fn fresh(&mut self, ino: u64, ttl: Duration) -> Option<(Kind, Duration)> {
        let (kind, at) = self.node(ino)?.seen?;
        let left = ttl.checked_sub(at.elapsed())?;
        (!left.is_zero()).then_some((kind, left))
    }
}

/// One entry of an open directory's snapshot.
struct DirItem {
    ino: u64,
    kind: FileType,
    name: String,
}

/// An open file handle.
#[derive(Clone)]
enum Open {
    /// Open for reading: the version it pinned.
    Read(Arc<OpenFile>),
    /// Open on a file this mount is writing (for writing, or for reading while it is
    /// written here).
    Write {
        file: Arc<WriteFile>,
        /// Open for writing (counted in the file's handles).
        writes: bool,
        /// `O_APPEND`: every write goes to the end.
        append: bool,
    },
}

struct Shared {
    client: Arc<Client>,
    inodes: Mutex<Inodes>,
    files: Mutex<HashMap<u64, Open>>,
    /// Files being written through this mount, by inode.
    writers: Mutex<HashMap<u64, Arc<WriteFile>>>,
    /// Directories made here in `write=through` mounts: object stores have none, so they
    /// exist (here) until a file is written beneath them or they are removed.
    made_dirs: Mutex<HashSet<String>>,
    /// Closes of released files in progress, and a wake-up when one ends.
    closing: AtomicUsize,
    closed: tokio::sync::Notify,
    dirs: Mutex<HashMap<u64, Arc<Vec<DirItem>>>>,
    next_fh: AtomicU64,
    options: FsOptions,
    uid: u32,
    gid: u32,
    /// The cluster's `file://` mounts opened on this machine, read for file modes only.
    local: MountTable,
    time: SystemTime,
    blksize: u32,
    notifier: OnceLock<Notifier>,
    /// The last `statfs` answer (capacity and bytes cached) and when it was asked.
    usage: Mutex<Option<(Instant, (u64, u64))>>,
}

/// Whole pages an open file keeps fetched or being fetched for a sequential reader.
const WINDOW_PAGES: usize = 4;

/// A whole page being fetched (or fetched), shared by every read that needs it.
type PageFetch = SharedFuture<BoxFuture<'static, Result<Bytes, Arc<Error>>>>;

/// An open file: the version it reads, and its read-ahead window.
struct OpenFile {
    info: ObjectInfo,
    /// The inode it was opened through.
    ino: u64,
    /// Read past the kernel's cache (another version was open through the inode).
    direct: bool,
    /// The cluster's page size.
    page_size: u64,
    window: Mutex<Window>,
}

/// A sequential reader's pages. The kernel's read-ahead sends reads of at most 1 MiB, several
/// at once; fetching each as its own range would cost a request (and a node's work) per piece
/// of a 4 MiB page. A read of a sequential run ([`ReadRun`]), or one that falls in a page
/// already here, is served from whole pages instead, and the next page is fetched ahead.
/// Other reads (random access) go straight to the range they want.
struct Window {
    /// The kernel's reads: one at the file's start begins a run at once.
    run: ReadRun,
    /// Pages, oldest first; at most [`WINDOW_PAGES`].
    pages: VecDeque<(u64, PageFetch)>,
}

impl Default for Window {
    fn default() -> Window {
        Window {
            run: ReadRun::from_file_start(),
            pages: VecDeque::new(),
        }
    }
}

/// The bytes `[offset, offset + want)` of `file` from its whole `pages`. A page that is shorter
/// than the file says means the object changed: ESTALE, as for a range read. A failed page
/// leaves the window, so the next read fetches it again.
async fn from_pages(
    file: &OpenFile,
    pages: &[(u64, PageFetch)],
    offset: u64,
    want: u64,
) -> Result<Bytes, Errno> {
    let end = offset + want;
    let mut out = BytesMut::new();
    for (p, fetch) in pages {
        let page = match fetch.clone().await {
            Ok(b) => b,
            Err(e) => {
                lock(&file.window).pages.retain(|(q, _)| q != p);
                return Err(errno("read", &file.info.path, &e));
            }
        };
        let start = p * file.page_size;
        let (lo, hi) = (
            offset.max(start) - start,
            end.min(start + file.page_size) - start,
        );
        if (page.len() as u64) < hi {
            warn!(
                "read {}: page {p} has {} bytes where {hi} were expected; the object changed \
                 since it was opened",
                file.info.path,
                page.len()
            );
            return Err(Errno::ESTALE);
        }
        if pages.len() == 1 {
            return Ok(page.slice(lo as usize..hi as usize));
        }
        out.extend_from_slice(&page[lo as usize..hi as usize]);
    }
    Ok(out.freeze())
}

/// The FUSE file system. Hand it to `fuser::Session::new`.
pub struct PageFs {
    shared: Arc<Shared>,
    rt: tokio::runtime::Handle,
}

/// A lock that survives a panic elsewhere (the tables stay consistent between statements).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn join(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// The errno for a client error; failures that are not answers are logged.
fn errno(op: &str, path: &str, e: &Error) -> Errno {
    match e {
        Error::NotFound(_) => Errno::ENOENT,
        Error::IsDir(_) => Errno::EISDIR,
        Error::NotDir(_) => Errno::ENOTDIR,
        Error::BadPath(_) | Error::BadRange(_) => {
            debug!("{op} {path}: {e}");
            Errno::EINVAL
        }
        Error::Changed(_) => {
            info!("{op} {path}: {e}");
            Errno::ESTALE
        }
        Error::Unavailable { .. } | Error::Config { .. } => {
            warn!("{op} {path}: {e}");
            Errno::EIO
        }
        Error::Forbidden(_) => {
            warn!("{op} {path}: {e}");
            Errno::EACCES
        }
        Error::Exists(_) | Error::Precondition(_) => Errno::EEXIST,
        Error::NotEmpty(_) => Errno::ENOTEMPTY,
        Error::NoSpace(_) => {
            warn!("{op} {path}: {e}");
            Errno::ENOSPC
        }
        Error::ReadOnly(_) => Errno::EROFS,
        Error::Invalid(_) => Errno::EINVAL,
    }
}

impl PageFs {
    /// For a sequential read of `want` bytes at `offset` (see [`Window`]): the pages it needs,
    /// each fetched whole (or being fetched), after starting the fetch of the page after them.
    /// `None`: not sequential, read the range itself.
    fn window_pages(
        &self,
        file: &OpenFile,
        offset: u64,
        want: u64,
    ) -> Option<Vec<(u64, PageFetch)>> {
        if want == 0 {
            return None;
        }
        let ps = file.page_size;
        let (first, last) = (offset / ps, (offset + want - 1) / ps);
        let mut w = lock(&file.window);
        let run = w.run.record(offset, want, ps);
        let sequential = run || w.pages.iter().any(|(p, _)| *p == first);
        if !sequential {
            return None;
        }
        let mut needed = Vec::new();
        for p in first..=last + 1 {
            if p * ps >= file.info.size {
                break;
            }
            let fetch = match w.pages.iter().find(|(q, _)| *q == p) {
                Some((_, f)) => f.clone(),
                None => {
                    let f = self.start_page_fetch(&file.info, p, ps as u32);
                    w.pages.push_back((p, f.clone()));
                    f
                }
            };
            if p <= last {
                needed.push((p, fetch));
            }
        }
        while w.pages.len() > WINDOW_PAGES {
            w.pages.pop_front();
        }
        Some(needed)
    }

    /// Starts fetching page `page` of `info` whole, now (a spawned task: a page fetched ahead
    /// is on its way before anyone waits for it).
    fn start_page_fetch(&self, info: &ObjectInfo, page: u64, page_size: u32) -> PageFetch {
        let (client, info) = (self.shared.client.clone(), info.clone());
        let task = self
            .rt
            .spawn(async move { client.read_page(&info, page, 0, page_size).await });
        async move {
            match task.await {
                Ok(r) => r.map_err(Arc::new),
                Err(e) => Err(Arc::new(Error::unavailable(format!("page fetch: {e}")))),
            }
        }
        .boxed()
        .shared()
    }

    /// A file system over `client`, whose requests run on `rt`.
    pub fn new(client: Arc<Client>, rt: tokio::runtime::Handle, options: FsOptions) -> PageFs {
        // SAFETY: getuid(2) and getgid(2) take no arguments and cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let blksize = client.page_size().clamp(4096, 4 << 20);
        let local: Vec<(String, String)> = client
            .mounts()
            .into_iter()
            .filter(|m| m.url.starts_with("file:"))
            .map(|m| (m.prefix, m.url))
            .collect();
        let local = MountTable::new_partial(&local);
        PageFs {
            shared: Arc::new(Shared {
                client,
                inodes: Mutex::new(Inodes::new()),
                files: Mutex::new(HashMap::new()),
                writers: Mutex::new(HashMap::new()),
                made_dirs: Mutex::new(HashSet::new()),
                closing: AtomicUsize::new(0),
                closed: tokio::sync::Notify::new(),
                dirs: Mutex::new(HashMap::new()),
                next_fh: AtomicU64::new(1),
                options,
                uid,
                gid,
                local,
                time: SystemTime::now(),
                blksize,
                notifier: OnceLock::new(),
                usage: Mutex::new(None),
            }),
            rt,
        }
    }

    /// Lets this file system tell the kernel to drop attributes it cached (from
    /// `Session::notifier`); without it, a size change is seen when the attribute TTL ends.
    pub fn notifier_slot(&self) -> NotifierSlot {
        NotifierSlot(self.shared.clone())
    }

    fn path(&self, ino: INodeNo) -> Option<Arc<str>> {
        lock(&self.shared.inodes).path(ino.0)
    }

    /// The cluster's `file://` mounts whose directories this machine does not have: pagefs
    /// cannot report their files' modes, so it cannot let the kernel keep other users out of
    /// files their modes forbid (see `--allow-other`).
    pub fn mounts_without_modes(&self) -> Vec<String> {
        self.shared
            .local
            .unavailable_prefixes()
            .map(|p| format!("{p}/"))
            .collect()
    }

    /// Whether some mount takes writes from this file system (otherwise it is mounted
    /// read-only, as before writes existed).
    pub fn takes_writes(&self) -> bool {
        let sh = &self.shared;
        sh.client.mounts().iter().any(|m| {
            let p = m.prefix.trim_end_matches('/');
            sh.writes(if p.is_empty() { "/" } else { p }) != Writes::No
        })
    }

    /// What finishes the closes of released files when the session has ended (see
    /// [`Drain::finish`]).
    pub fn drain(&self) -> Drain {
        Drain(self.shared.clone())
    }
}

/// Finishes what the file system still owes the cluster once its session has ended.
pub struct Drain(Arc<Shared>);

impl Drain {
    /// Waits (at most `limit`) for the closes of released files in progress, then closes the
    /// files whose descriptors the kernel never released (the session ended with them open):
    /// what they wrote is committed for good. Returns how many files were left open.
    pub async fn finish(&self, limit: Duration) -> usize {
        let sh = &self.0;
        let deadline = tokio::time::Instant::now() + limit;
        while sh.closing.load(Ordering::Acquire) > 0 {
            let woken = sh.closed.notified();
            if sh.closing.load(Ordering::Acquire) == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                warn!(
                    "{} file(s) still closing after {limit:?}; exiting without them",
                    sh.closing.load(Ordering::Acquire)
                );
                return 0;
            }
        }
        let left: Vec<Arc<WriteFile>> = lock(&sh.writers)
            .values()
            .filter(|w| w.handles() > 0)
            .cloned()
            .collect();
        for w in &left {
            w.handles.store(0, Ordering::Release);
            let path = w.path();
            match tokio::time::timeout_at(deadline, w.close(&sh.client)).await {
                Ok(_) => info!("{path}: closed at exit (its descriptors were never released)"),
                Err(_) => warn!("{path}: not closed within {limit:?}"),
            }
        }
        left.len()
    }
}

/// Where the session's notifier goes once the session exists (see [`PageFs::notifier_slot`]).
pub struct NotifierSlot(Arc<Shared>);

impl NotifierSlot {
    /// Installs the notifier (once).
    pub fn set(&self, n: Notifier) {
        let _ = self.0.notifier.set(n);
    }
}

impl Shared {
    fn ttl(&self) -> Duration {
        self.options.attr_ttl
    }

    /// How `path` takes writes from this mount.
    fn writes(&self, path: &str) -> Writes {
        if self.options.read_only || self.mount_of(path).is_none() {
            return Writes::No;
        }
        if self.client.write_policy(path).is_cached() {
            return Writes::Cluster;
        }
        match self.client.ufs_table() {
            Some(t) if t.mount_of(path).is_some() => Writes::Store,
            _ => Writes::No,
        }
    }

    /// The prefix of the mount that holds `path` (the longest that matches).
    fn mount_of(&self, path: &str) -> Option<String> {
        self.client
            .mounts()
            .into_iter()
            .map(|m| m.prefix.trim_end_matches('/').to_string())
            .filter(|p| p.is_empty() || path == p || path.starts_with(&format!("{p}/")))
            .max_by_key(|p| p.len())
    }

    /// Mode bits, owner and group of `path`. Under a `file://` mount: the local file's
    /// (special bits removed, write bits too unless the path takes writes here), or no access
    /// at all (mode 0, root's) when the file cannot be examined here; a file written through
    /// the cluster that the store does not hold yet shows the defaults. Elsewhere (object
    /// stores have no per-user modes): readable (and writable, where the path takes writes)
    /// by everyone who may use the mount, owned by the mounting user.
    fn perm(&self, path: Option<&str>, kind: Kind) -> (u16, u32, u32) {
        let writes = path.map_or(Writes::No, |p| self.writes(p));
        let keep: u16 = if writes == Writes::No { 0o555 } else { 0o777 };
        let open = match kind {
            Kind::Dir(_) => 0o755 & keep,
            Kind::File(..) => 0o644 & keep,
        };
        let Some(path) = path.filter(|p| self.local.is_local(p)) else {
            return (open, self.uid, self.gid);
        };
        match self.local.local_attributes(path) {
            Ok(Some((mode, uid, gid))) => ((mode & u32::from(keep)) as u16, uid, gid),
            Ok(None) if writes == Writes::Cluster => (open, self.uid, self.gid),
            Ok(None) => (0, 0, 0),
            Err(e) => {
                debug!("mode of {path}: {e}");
                (0, 0, 0)
            }
        }
    }

    fn attr(&self, ino: u64, path: Option<&str>, kind: Kind) -> FileAttr {
        let (perm, uid, gid) = self.perm(path, kind);
        let (kind, size, nlink, time) = match kind {
            Kind::Dir(0) => (FileType::Directory, 0, 2, self.time),
            Kind::Dir(mtime_ns) => (FileType::Directory, 0, 2, system_time(mtime_ns)),
            Kind::File(size, mtime_ns) => (FileType::RegularFile, size, 1, system_time(mtime_ns)),
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: time,
            mtime: time,
            ctime: time,
            crtime: time,
            kind,
            perm,
            nlink,
            uid,
            gid,
            rdev: 0,
            blksize: self.blksize,
            flags: 0,
        }
    }

    /// The attributes of a file being written here: its writer's size and time.
    fn writer_attr(&self, w: &WriteFile) -> FileAttr {
        let (size, mtime_ns) = *lock(&w.attrs);
        self.attr(w.ino, Some(&w.path()), Kind::File(size, mtime_ns))
    }

    /// The file this mount is writing at inode `ino`, if any.
    fn live_writer(&self, ino: u64) -> Option<Arc<WriteFile>> {
        lock(&self.writers).get(&ino).cloned()
    }

    /// The writer of inode `ino` (made if none), with one more descriptor counted.
    fn writer_for(&self, ino: u64, path: &str, how: Writes) -> Arc<WriteFile> {
        let mut ws = lock(&self.writers);
        let w = ws
            .entry(ino)
            .or_insert_with(|| Arc::new(WriteFile::new(ino, Arc::from(path), how)))
            .clone();
        w.handles.fetch_add(1, Ordering::AcqRel);
        w
    }

    /// One descriptor of `w` fewer; whether it was the last.
    fn let_go(&self, w: &WriteFile) -> bool {
        let _ws = lock(&self.writers);
        w.handles.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Drops `w` from the table of writers once nothing holds it open.
    fn forget_writer(&self, w: &Arc<WriteFile>) {
        let mut ws = lock(&self.writers);
        if w.handles() == 0 && ws.get(&w.ino).is_some_and(|x| Arc::ptr_eq(x, w)) {
            ws.remove(&w.ino);
        }
    }

    /// Closes `w` for good now that its last descriptor is released, and records what it
    /// left.
    async fn close_writer(&self, w: Arc<WriteFile>) {
        let info = w.close(&self.client).await;
        if let Some(info) = info {
            self.note_written(&w, &info);
        }
        self.forget_writer(&w);
        self.forget_attributes(w.ino);
    }

    /// Tells the kernel to forget the attributes (size included) it holds of inode `ino`: its
    /// next fstat, or read past the size it holds, asks again. Attributes only (offset -1):
    /// its cached pages stay. Fails harmlessly if the kernel has already forgotten the inode.
    ///
    /// An open that needs it sends it before it answers: the kernel drops an attribute
    /// answer, and a short read's word on the size, when attributes were invalidated while
    /// the request was out, so one sent after the answer can race the opener's first fstat
    /// and reads, which then run on the old size (zeros read past a shorter version's end).
    fn forget_attributes(&self, ino: u64) {
        if let Some(n) = self.notifier.get() {
            let _ = n.inval_inode(INodeNo(ino), -1, 0);
        }
    }

    /// Records what a stat of `w`'s path answers after a commit or upload.
    fn note_written(&self, w: &WriteFile, info: &ObjectInfo) {
        let path = w.path();
        let mut t = lock(&self.inodes);
        if t.by_path.get(&*path) == Some(&w.ino) {
            t.note(&path, Kind::File(info.size, info.mtime_ns), Instant::now());
        }
    }

    fn fresh(&self, ino: u64) -> Option<(Kind, Duration)> {
        lock(&self.inodes).fresh(ino, self.ttl())
    }

    fn note(&self, path: &str, kind: Kind) -> u64 {
        lock(&self.inodes).note(path, kind, Instant::now())
    }

    /// `path` is gone (unlinked, removed): a later lookup finds what is there then.
    fn forget_path(&self, path: &str) {
        self.entries_changed(path);
        let mut t = lock(&self.inodes);
        if let Some(ino) = t.by_path.remove(path) {
            if let Some(n) = t.node(ino) {
                n.seen = None;
            }
        }
    }

    /// An entry was made or removed at `path`: its directory's attributes are asked for again
    /// (a directory made through the cluster takes the change's time, as a disk's does).
    fn entries_changed(&self, path: &str) {
        let Some(dir) = pagestore_protocol::writeback::parent(path) else {
            return;
        };
        let mut t = lock(&self.inodes);
        if let Some(ino) = t.by_path.get(dir).copied() {
            if let Some(n) = t.node(ino) {
                n.seen = None;
            }
        }
    }

    /// `from` is now `to`: its inode (and its writer here) moves with it.
    fn renamed(&self, from: &str, to: &str) {
        self.entries_changed(from);
        self.entries_changed(to);
        let moved = {
            let mut t = lock(&self.inodes);
            let to_arc: Arc<str> = Arc::from(to);
            match t.by_path.remove(from) {
                Some(ino) => {
                    t.by_path.insert(to_arc.clone(), ino);
                    if let Some(n) = t.node(ino) {
                        n.path = to_arc.clone();
                    }
                    Some((ino, to_arc))
                }
                None => {
                    t.by_path.remove(to);
                    None
                }
            }
        };
        if let Some((ino, to)) = moved {
            if let Some(w) = self.live_writer(ino) {
                *lock(&w.path) = to;
            }
        }
    }

    fn next_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    /// A descriptor open for reading `file` was closed: one reader of its version fewer on
    /// its inode.
    fn closed_reader(&self, file: &OpenFile) {
        if let Some(n) = lock(&self.inodes).node(file.ino) {
            n.close_reader(version_of(&file.info), file.direct);
        }
    }

    /// `kind` for file inode `ino`, or, while descriptors read a version of it through the
    /// kernel's cache, that version's size and time: the kernel keeps one size per inode, and
    /// a cached reader stops at it (readers of other versions read past the cache; `open`).
    fn as_cached(&self, ino: u64, kind: Kind) -> Kind {
        if !matches!(kind, Kind::File(..)) {
            return kind;
        }
        let mut t = lock(&self.inodes);
        t.node(ino)
            .and_then(|n| n.readers.iter().find(|r| !r.direct))
            .map_or(kind, |r| Kind::File(r.version.1, r.version.2))
    }

    /// A handle on a file this mount writes, and the open flags to answer with:
    /// `FOPEN_DIRECT_IO` for `O_APPEND` (its writes go to the writer's end, which the
    /// kernel's page cache cannot know).
    fn write_handle(&self, file: Arc<WriteFile>, writes: bool, append: bool) -> (u64, FopenFlags) {
        let fh = self.next_fh();
        lock(&self.files).insert(
            fh,
            Open::Write {
                file,
                writes,
                append,
            },
        );
        let flags = if append {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        };
        (fh, flags)
    }

    /// Renames the file `from` to `to` (one mount; see `Filesystem::rename`). `writer`: this
    /// mount's writer of `from`, if it is being written here.
    async fn rename(
        &self,
        from: &str,
        to: &str,
        replace: bool,
        how: Writes,
        writer: Option<Arc<WriteFile>>,
    ) -> Result<(), Errno> {
        // Directories are not renamed: `mv` copies them (EXDEV).
        match self.is_dir(from).await {
            Ok(true) => return Err(Errno::EXDEV),
            Ok(false) => {}
            // Staged here and not in the store yet.
            Err(Error::NotFound(_)) if writer.is_some() => {}
            Err(e) => return Err(errno("rename", from, &e)),
        }
        let exists = match self.is_dir(to).await {
            Ok(true) => return Err(Errno::EISDIR),
            Ok(false) => true,
            Err(Error::NotFound(_)) => false,
            Err(e) => return Err(errno("rename", to, &e)),
        };
        if exists && !replace {
            return Err(Errno::EEXIST);
        }
        match how {
            Writes::Cluster => self
                .client
                .rename(from, to, replace)
                .await
                .map_err(|e| errno("rename", from, &e)),
            Writes::Store => self.store_rename(from, to, writer).await,
            Writes::No => Err(Errno::EROFS),
        }
    }

    /// A rename in a `write=through` mount: object stores have none, so the object is copied
    /// in the store, then deleted (readers may see both names for a moment, never a partial
    /// file). A file staged here is sent to the store first.
    async fn store_rename(
        &self,
        from: &str,
        to: &str,
        writer: Option<Arc<WriteFile>>,
    ) -> Result<(), Errno> {
        if let Some(w) = &writer {
            if let Some(info) = w.sync(&self.client).await? {
                self.note_written(w, &info);
            }
        }
        let t = self.client.writable().map_err(|_| Errno::EROFS)?;
        let old = t.stat(to).await.ok().map(|i| i.file_id);
        t.copy(from, to)
            .await
            .map_err(|e| errno("rename", from, &Error::from(e)))?;
        self.client.invalidate(to, old).await;
        self.client
            .delete(from)
            .await
            .map_err(|e| errno("rename", from, &e))
    }

    async fn stat(&self, path: &str) -> Result<(u64, Kind), Error> {
        let kind = match self.client.stat_path(path).await {
            Ok(k) => Kind::from(&k),
            Err(Error::NotFound(_)) if lock(&self.made_dirs).contains(path) => Kind::Dir(0),
            Err(e) => return Err(e),
        };
        Ok((self.note(path, kind), kind))
    }

    /// Lists `path` and returns its snapshot: `.`, `..`, then the entries in name order, then
    /// what this mount writes there that the store does not show yet.
    async fn list(&self, ino: u64, path: &str) -> Result<Vec<DirItem>, Error> {
        let entries = match self.client.list(path).await {
            Ok(e) => e,
            Err(Error::NotFound(_)) if lock(&self.made_dirs).contains(path) => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut here: Vec<(String, Option<u64>, FileType)> = lock(&self.writers)
            .values()
            .map(|w| (w.path().to_string(), Some(w.ino), FileType::RegularFile))
            .collect();
        here.extend(
            lock(&self.made_dirs)
                .iter()
                .map(|d| (d.clone(), None, FileType::Directory)),
        );
        let now = Instant::now();
        let mut t = lock(&self.inodes);
        let parent = t.intern(parent_of(path));
        if let Some(n) = t.node(ino) {
            // Still a directory, with the time last seen (a listing does not say its own).
            let kind = match n.seen {
                Some((Kind::Dir(mtime_ns), _)) => Kind::Dir(mtime_ns),
                _ => Kind::Dir(0),
            };
            n.seen = Some((kind, now));
        }
        let mut items = Vec::with_capacity(entries.len() + 2);
        for (name, ino) in [(".", ino), ("..", parent)] {
            items.push(DirItem {
                ino,
                kind: FileType::Directory,
                name: name.into(),
            });
        }
        let mut names = HashSet::new();
        for e in entries {
            let (kind, ft) = if e.is_dir {
                (Kind::Dir(e.mtime_ns), FileType::Directory)
            } else {
                (Kind::File(e.size, e.mtime_ns), FileType::RegularFile)
            };
            names.insert(e.name.clone());
            items.push(DirItem {
                ino: t.note(&join(path, &e.name), kind, now),
                kind: ft,
                name: e.name,
            });
        }
        for (p, ino, kind) in here {
            // A writer of a path unlinked or renamed over since is not there.
            let gone = ino.is_some_and(|i| t.by_path.get(p.as_str()) != Some(&i));
            if parent_of(&p) != path || p == path || gone {
                continue;
            }
            let name = p.rsplit('/').next().unwrap_or_default().to_string();
            if names.insert(name.clone()) {
                items.push(DirItem {
                    ino: t.intern(&p),
                    kind,
                    name,
                });
            }
        }
        Ok(items)
    }

    /// Whether `path` is a directory (as this mount knows it, else as the cluster says).
    async fn is_dir(&self, path: &str) -> Result<bool, Error> {
        if lock(&self.made_dirs).contains(path) {
            return Ok(true);
        }
        match self.client.stat_path(path).await {
            Ok(k) => Ok(matches!(k, PathKind::Dir { .. })),
            Err(e) => Err(e),
        }
    }
}

impl PageFs {
    fn handle(&self, fh: FileHandle) -> Option<Open> {
        lock(&self.shared.files).get(&fh.0).cloned()
    }

    /// Answers an fsync or a close(2) of a file being written: durable and visible, or the
    /// file's error.
    fn sync_reply(&self, file: Arc<WriteFile>, reply: ReplyEmpty) {
        let sh = self.shared.clone();
        self.rt.spawn(async move {
            match file.sync(&sh.client).await {
                Ok(info) => {
                    if let Some(info) = info {
                        sh.note_written(&file, &info);
                    }
                    reply.ok()
                }
                Err(e) => reply.error(e),
            }
        });
    }
}

/// Splits a name into a path under `dir`, or refuses a name that is not UTF-8.
fn child(dir: Option<Arc<str>>, name: &OsStr) -> Option<String> {
    Some(join(&dir?, name.to_str()?))
}

/// Whether a name is too long to be made (ENAMETOOLONG): the cluster and the file systems
/// under it take names of at most 255 bytes. Looked up, such a name is simply not there.
fn too_long(name: &OsStr) -> bool {
    name.len() > pagestore_protocol::writeback::MAX_NAME_LEN
}

impl Filesystem for PageFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let o = &self.shared.options;
        if let Err(max) = config.set_max_readahead(o.readahead.max(1)) {
            let _ = config.set_max_readahead(max);
        }
        let _ = config.set_max_background(o.max_background.max(1));
        let _ = config.set_congestion_threshold((o.max_background / 4 * 3).max(1));
        // Lookups and readdirs of one directory may run in parallel; an open with O_TRUNC
        // comes as one request (a fresh empty version, not a copy of the old one, then a
        // truncation).
        let _ = config
            .add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS | InitFlags::FUSE_ATOMIC_O_TRUNC);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Some(path) = child(self.path(parent), name) else {
            return reply.error(Errno::ENOENT);
        };
        let sh = self.shared.clone();
        let known = lock(&sh.inodes).by_path.get(path.as_str()).copied();
        // A file being written here: its writer's size, never cached by the kernel.
        if let Some(w) = known.and_then(|i| sh.live_writer(i)) {
            return reply.entry_with_ttls(
                &Duration::ZERO,
                &sh.ttl(),
                &sh.writer_attr(&w),
                Generation(0),
            );
        }
        if let Some((ino, (kind, left))) = known.and_then(|i| Some((i, sh.fresh(i)?))) {
            let kind = sh.as_cached(ino, kind);
            return reply.entry(
                &left,
                &sh.attr(ino, Some(path.as_str()), kind),
                Generation(0),
            );
        }
        self.rt.spawn(async move {
            match sh.stat(&path).await {
                Ok((ino, kind)) => reply.entry(
                    &sh.ttl(),
                    &sh.attr(ino, Some(path.as_str()), sh.as_cached(ino, kind)),
                    Generation(0),
                ),
                // A negative entry: the kernel remembers the miss for the TTL. Only a definite
                // "no such object" is cached; a store that cannot answer is EIO, asked again.
                // Not under a mount written through the cluster, whose names any client may
                // make at any time (a reader that opens after a writer's close finds it).
                Err(Error::NotFound(_)) => {
                    let ttl = match sh.writes(&path) {
                        Writes::Cluster => Duration::ZERO,
                        _ => sh.ttl(),
                    };
                    reply.entry(&ttl, &sh.attr(0, None, Kind::File(0, 0)), Generation(0))
                }
                Err(e) => reply.error(errno("lookup", &path, &e)),
            }
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let sh = self.shared.clone();
        if ino == INodeNo::ROOT {
            return reply.attr(&sh.ttl(), &sh.attr(1, Some("/"), Kind::Dir(0)));
        }
        match fh.and_then(|fh| self.handle(fh)) {
            // An open handle answers for the version it pinned.
            Some(Open::Read(file)) => {
                let kind = sh.as_cached(ino.0, Kind::File(file.info.size, file.info.mtime_ns));
                return reply.attr(
                    &sh.ttl(),
                    &sh.attr(ino.0, Some(file.info.path.as_str()), kind),
                );
            }
            Some(Open::Write { file, .. }) => {
                return reply.attr(&Duration::ZERO, &sh.writer_attr(&file));
            }
            None => {}
        }
        if let Some(w) = sh.live_writer(ino.0) {
            return reply.attr(&Duration::ZERO, &sh.writer_attr(&w));
        }
        let Some(path) = self.path(ino) else {
            return reply.error(Errno::ENOENT);
        };
        if let Some((kind, left)) = sh.fresh(ino.0) {
            let kind = sh.as_cached(ino.0, kind);
            return reply.attr(&left, &sh.attr(ino.0, Some(&*path), kind));
        }
        self.rt.spawn(async move {
            match sh.stat(&path).await {
                Ok((_, kind)) => {
                    let kind = sh.as_cached(ino.0, kind);
                    reply.attr(&sh.ttl(), &sh.attr(ino.0, Some(&*path), kind))
                }
                Err(e) => reply.error(errno("getattr", &path, &e)),
            }
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let Some(path) = self.path(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let sh = self.shared.clone();
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            let how = sh.writes(&path);
            if how == Writes::No {
                return reply.error(Errno::EROFS);
            }
            let start = if flags.0 & libc::O_TRUNC != 0 {
                Start::Truncate
            } else {
                Start::Keep
            };
            let append = flags.0 & libc::O_APPEND != 0;
            let w = sh.writer_for(ino.0, &path, how);
            self.rt.spawn(async move {
                if let Err(e) = w.start(&sh.client, &sh.options.staging_dir, start).await {
                    if sh.let_go(&w) {
                        sh.close_writer(w).await;
                    }
                    return reply.error(e);
                }
                let (fh, flags) = sh.write_handle(w, true, append);
                // The kernel may hold this file's size from before (another writer's).
                sh.forget_attributes(ino.0);
                reply.opened(FileHandle(fh), flags);
            });
            return;
        }
        // Read while this mount writes it: what the writer has.
        if let Some(w) = sh.live_writer(ino.0) {
            let (fh, flags) = sh.write_handle(w, false, false);
            return reply.opened(FileHandle(fh), flags);
        }
        self.rt.spawn(async move {
            let info = match sh.client.stat(&path).await {
                Ok(i) => i,
                Err(e) => return reply.error(errno("open", &path, &e)),
            };
            let fh = sh.next_fh();
            // The kernel keeps its cached pages of the file only if this is the version they
            // came from (a file still being written changes under one version), and must
            // forget its cached size if this version has another one. The kernel has one cache
            // per inode, and an inode per path: while another version is open for reading
            // through it (a reader of the file a rename replaced), this one is read past the
            // cache (direct I/O), or either reader would get pages of the other's version, and
            // the next open drops what the cache holds.
            let (keep, direct, resized) = {
                let mut t = lock(&sh.inodes);
                let before = t.node(ino.0).and_then(|n| n.seen).map(|(k, _)| k);
                let now = Kind::File(info.size, info.mtime_ns);
                t.note(&path, now, Instant::now());
                let (keep, direct) = t
                    .node(ino.0)
                    .map_or((false, false), |n| n.open_reader(version_of(&info)));
                (
                    keep && info.state != FileState::Writing,
                    direct,
                    before != Some(now),
                )
            };
            lock(&sh.files).insert(
                fh,
                Open::Read(Arc::new(OpenFile {
                    info,
                    ino: ino.0,
                    direct,
                    page_size: u64::from(sh.client.page_size()),
                    window: Mutex::new(Window::default()),
                })),
            );
            let flags = if direct {
                FopenFlags::FOPEN_DIRECT_IO
            } else if keep {
                FopenFlags::FOPEN_KEEP_CACHE
            } else {
                FopenFlags::empty()
            };
            // A reader past the cache leaves the kernel's size to the cached readers'.
            if !direct && (resized || !keep) {
                sh.forget_attributes(ino.0);
            }
            reply.opened(FileHandle(fh), flags);
        });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let file = match self.handle(fh) {
            Some(Open::Read(file)) => file,
            Some(Open::Write { file, .. }) => {
                let sh = self.shared.clone();
                self.rt.spawn(async move {
                    match file.read(&sh.client, offset, u64::from(size)).await {
                        Ok(b) => reply.data(&b),
                        Err(e) => reply.error(e),
                    }
                });
                return;
            }
            None => return reply.error(Errno::EBADF),
        };
        let sh = self.shared.clone();
        let want = file.info.size.saturating_sub(offset).min(u64::from(size));
        if let Some(pages) = self.window_pages(&file, offset, want) {
            self.rt.spawn(async move {
                match from_pages(&file, &pages, offset, want).await {
                    Ok(b) => reply.data(&b),
                    Err(e) => reply.error(e),
                }
            });
            return;
        }
        self.rt.spawn(async move {
            let info = &file.info;
            match sh.client.read_at(info, offset, u64::from(size)).await {
                Ok(b) if b.len() as u64 == want => reply.data(&b),
                Ok(b) => {
                    warn!(
                        "read {}: {} bytes at {offset} where {want} were expected; the object \
                         changed since it was opened",
                        info.path,
                        b.len()
                    );
                    reply.error(Errno::ESTALE)
                }
                Err(e) => reply.error(errno("read", &info.path, &e)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Some(Open::Write {
            file,
            writes: true,
            append,
        }) = self.handle(fh)
        else {
            return reply.error(Errno::EBADF);
        };
        let Ok(n) = u32::try_from(data.len()) else {
            return reply.error(Errno::EINVAL);
        };
        let data = data.to_vec();
        self.rt.spawn(async move {
            match file.write(offset, &data, append).await {
                Ok(_) => reply.written(n),
                Err(e) => reply.error(e),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) of a descriptor open for writing: what it wrote becomes durable and
        // visible, and an error reaches close's caller.
        match self.handle(fh) {
            Some(Open::Write {
                file, writes: true, ..
            }) => self.sync_reply(file, reply),
            _ => reply.ok(),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.handle(fh) {
            Some(Open::Write { file, .. }) => self.sync_reply(file, reply),
            _ => reply.ok(),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let open = lock(&self.shared.files).remove(&fh.0);
        if let Some(Open::Read(file)) = &open {
            self.shared.closed_reader(file);
        }
        let Some(Open::Write {
            file, writes: true, ..
        }) = open
        else {
            return reply.ok();
        };
        let sh = self.shared.clone();
        if !sh.let_go(&file) {
            return reply.ok();
        }
        // The last descriptor: the version is closed for good (the kernel does not pass a
        // release's error on; close(2) got flush's).
        // Counted before the task starts, so that a drain at exit waits for it.
        sh.closing.fetch_add(1, Ordering::AcqRel);
        self.rt.spawn(async move {
            sh.close_writer(file).await;
            if sh.closing.fetch_sub(1, Ordering::AcqRel) == 1 {
                sh.closed.notify_waiters();
            }
            reply.ok();
        });
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let Some(path) = self.path(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let sh = self.shared.clone();
        self.rt.spawn(async move {
            match sh.list(ino.0, &path).await {
                Ok(items) => {
                    let fh = sh.next_fh();
                    lock(&sh.dirs).insert(fh, Arc::new(items));
                    reply.opened(FileHandle(fh), FopenFlags::empty());
                }
                Err(e) => reply.error(errno("opendir", &path, &e)),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(items) = lock(&self.shared.dirs).get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        // An entry's offset is the position after it: where the next readdir starts.
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, item) in items.iter().enumerate().skip(start) {
            if reply.add(INodeNo(item.ino), i as u64 + 1, item.kind, &item.name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        lock(&self.shared.dirs).remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // The cluster's cache: its capacity and what it holds. The object stores' size is
        // unknown, and so are the inode counts (0: `df -i` shows none, not a full table).
        let sh = self.shared.clone();
        let reply_with = move |sh: &Shared, (capacity, used): (u64, u64)| {
            let f = u64::from(STATFS_FRAGMENT);
            let blocks = capacity / f;
            let free = blocks.saturating_sub(used.div_ceil(f));
            reply.statfs(blocks, free, free, 0, 0, sh.blksize, 255, STATFS_FRAGMENT);
        };
        let cached = *lock(&sh.usage);
        if let Some((_, usage)) = cached.filter(|(at, _)| at.elapsed() < STATFS_TTL) {
            return reply_with(&sh, usage);
        }
        self.rt.spawn(async move {
            let usage = sh
                .client
                .shard_stats()
                .await
                .into_iter()
                .filter_map(|(_, _, s)| s)
                .fold((0u64, 0u64), |(c, u), s| {
                    (
                        c.saturating_add(s.capacity_bytes),
                        u.saturating_add(s.bytes),
                    )
                });
            *lock(&sh.usage) = Some((Instant::now(), usage));
            reply_with(&sh, usage);
        });
    }

    /// The size is kept (truncate, ftruncate), and so is the modification time of a file or a
    /// directory made through the cluster (utimensat, `touch`, `cp -p`, `cp -a`); modes,
    /// owners, access times and the times of files and directories only in the store are
    /// accepted and not kept (stores have none to set); everything is EROFS where the path
    /// takes no writes.
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let sh = self.shared.clone();
        let mtime = mtime.map(|t| match t {
            TimeOrNow::Now => pagestore_protocol::writeback::unix_ns(),
            TimeOrNow::SpecificTime(t) => unix_ns_of(t),
        });
        let writer = match fh.and_then(|fh| self.handle(fh)) {
            Some(Open::Write {
                file, writes: true, ..
            }) => Some(file),
            _ => sh.live_writer(ino.0),
        };
        if let Some(w) = &writer {
            if size.is_none() && mtime.is_none() {
                return reply.attr(&Duration::ZERO, &sh.writer_attr(w));
            }
        }
        let path = self.path(ino);
        self.rt.spawn(async move {
            if let Some(w) = writer {
                match w.change_if_open(size, mtime).await {
                    Some(Ok(())) => return reply.attr(&Duration::ZERO, &sh.writer_attr(&w)),
                    Some(Err(e)) => return reply.error(e),
                    // Closed meanwhile: the path's file is changed instead.
                    None => {}
                }
            }
            let Some(path) = path else {
                return reply.error(Errno::ENOENT);
            };
            let how = sh.writes(&path);
            if how == Writes::No {
                return reply.error(Errno::EROFS);
            }
            if let Some(size) = size {
                if let Err(e) =
                    write::truncate_path(&sh.client, &sh.options.staging_dir, &path, how, size)
                        .await
                {
                    return reply.error(e);
                }
            }
            if let (Some(t), Writes::Cluster) = (mtime, how) {
                if let Err(e) = write::set_time(&sh.client, &path, t).await {
                    return reply.error(e);
                }
            }
            match sh.stat(&path).await {
                Ok((_, kind)) => reply.attr(&sh.ttl(), &sh.attr(ino.0, Some(&*path), kind)),
                Err(e) => reply.error(errno("setattr", &path, &e)),
            }
        });
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        if too_long(name) {
            return reply.error(Errno::ENAMETOOLONG);
        }
        let Some(path) = child(self.path(parent), name) else {
            return reply.error(Errno::EINVAL);
        };
        let sh = self.shared.clone();
        let how = sh.writes(&path);
        if how == Writes::No {
            return reply.error(Errno::EROFS);
        }
        let (trunc, excl) = (flags & libc::O_TRUNC != 0, flags & libc::O_EXCL != 0);
        let append = flags & libc::O_APPEND != 0;
        self.rt.spawn(async move {
            // The kernel creates where its lookup found nothing; another client may have
            // made the file since (O_EXCL is not atomic across clients).
            let start = if trunc && !excl {
                Start::Truncate
            } else {
                match sh.client.stat_path(&path).await {
                    Ok(PathKind::Dir { .. }) => return reply.error(Errno::EISDIR),
                    Ok(PathKind::File { .. }) if excl => return reply.error(Errno::EEXIST),
                    Ok(PathKind::File { .. }) if trunc => Start::Truncate,
                    Ok(PathKind::File { .. }) => Start::Keep,
                    Err(Error::NotFound(_)) => Start::Create,
                    Err(e) => return reply.error(errno("create", &path, &e)),
                }
            };
            let ino = lock(&sh.inodes).intern(&path);
            let w = sh.writer_for(ino, &path, how);
            if let Err(e) = w.start(&sh.client, &sh.options.staging_dir, start).await {
                if sh.let_go(&w) {
                    sh.close_writer(w).await;
                }
                return reply.error(e);
            }
            // Made, or perhaps made (a truncating create asks nothing first).
            sh.entries_changed(&path);
            let attr = sh.writer_attr(&w);
            let (fh, flags) = sh.write_handle(w, true, append);
            reply.created(&Duration::ZERO, &attr, Generation(0), FileHandle(fh), flags);
        });
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        if too_long(name) {
            return reply.error(Errno::ENAMETOOLONG);
        }
        let Some(path) = child(self.path(parent), name) else {
            return reply.error(Errno::EINVAL);
        };
        let sh = self.shared.clone();
        let how = sh.writes(&path);
        if how == Writes::No {
            return reply.error(Errno::EROFS);
        }
        self.rt.spawn(async move {
            // The cluster keeps a directory's time; elsewhere it has none (0).
            let mtime_ns = match how {
                Writes::Cluster => pagestore_protocol::writeback::unix_ns(),
                _ => 0,
            };
            let made = match how {
                Writes::Cluster => sh.client.make_dir_at(&path, mtime_ns).await,
                // Object stores have no directories: this one exists here until a file is
                // written beneath it (then the store shows it) or it is removed.
                _ => match sh.is_dir(&path).await {
                    Ok(_) => Err(Error::Exists(path.clone())),
                    Err(Error::NotFound(_)) => {
                        lock(&sh.made_dirs).insert(path.clone());
                        Ok(())
                    }
                    Err(e) => Err(e),
                },
            };
            match made {
                Ok(()) => {
                    sh.entries_changed(&path);
                    let ino = sh.note(&path, Kind::Dir(mtime_ns));
                    reply.entry(
                        &sh.ttl(),
                        &sh.attr(ino, Some(&path), Kind::Dir(mtime_ns)),
                        Generation(0),
                    )
                }
                Err(e) => reply.error(errno("mkdir", &path, &e)),
            }
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let Some(path) = child(self.path(parent), name) else {
            return reply.error(Errno::ENOENT);
        };
        let sh = self.shared.clone();
        let how = sh.writes(&path);
        if how == Writes::No {
            return reply.error(Errno::EROFS);
        }
        let ino = lock(&sh.inodes).by_path.get(path.as_str()).copied();
        let writer = ino.and_then(|i| sh.live_writer(i));
        self.rt.spawn(async move {
            if let Some(w) = &writer {
                w.unlinked().await;
            }
            let r = match sh.is_dir(&path).await {
                Ok(true) => Err(Errno::EISDIR),
                // Only here so far (staged, never sent): nothing to delete in the store.
                Err(Error::NotFound(_)) if writer.is_some() => Ok(()),
                Err(e) => Err(errno("unlink", &path, &e)),
                Ok(false) => {
                    let r = match how {
                        Writes::Cluster => sh.client.remove_file(&path).await,
                        _ => sh.client.delete(&path).await,
                    };
                    r.map_err(|e| errno("unlink", &path, &e))
                }
            };
            match r {
                Ok(()) => {
                    sh.forget_path(&path);
                    reply.ok()
                }
                Err(e) => reply.error(e),
            }
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let Some(path) = child(self.path(parent), name) else {
            return reply.error(Errno::ENOENT);
        };
        let sh = self.shared.clone();
        let how = sh.writes(&path);
        if how == Writes::No || sh.mount_of(&path).as_deref() == Some(path.as_str()) {
            // A mount point is not removed by a file system call.
            return reply.error(if how == Writes::No {
                Errno::EROFS
            } else {
                Errno::EBUSY
            });
        }
        self.rt.spawn(async move {
            let made_here = lock(&sh.made_dirs).contains(&path);
            let r = match sh.client.stat_path(&path).await {
                Ok(PathKind::File { .. }) => Err(Errno::ENOTDIR),
                Ok(PathKind::Dir { .. }) => match how {
                    Writes::Cluster => sh
                        .client
                        .remove_dir(&path)
                        .await
                        .map_err(|e| errno("rmdir", &path, &e)),
                    // A directory of an object store holds an object (or it would not be).
                    _ => Err(Errno::ENOTEMPTY),
                },
                Err(Error::NotFound(_)) if made_here => {
                    let busy = lock(&sh.writers)
                        .values()
                        .any(|w| w.path().starts_with(&format!("{path}/")))
                        || lock(&sh.made_dirs)
                            .iter()
                            .any(|d| d.starts_with(&format!("{path}/")));
                    if busy {
                        Err(Errno::ENOTEMPTY)
                    } else {
                        Ok(())
                    }
                }
                Err(e) => Err(errno("rmdir", &path, &e)),
            };
            match r {
                Ok(()) => {
                    lock(&sh.made_dirs).remove(&path);
                    sh.forget_path(&path);
                    reply.ok()
                }
                Err(e) => reply.error(e),
            }
        });
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if too_long(newname) {
            return reply.error(Errno::ENAMETOOLONG);
        }
        let (Some(from), Some(to)) = (
            child(self.path(parent), name),
            child(self.path(newparent), newname),
        ) else {
            return reply.error(Errno::ENOENT);
        };
        if flags.intersects(RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let replace = !flags.contains(RenameFlags::RENAME_NOREPLACE);
        let sh = self.shared.clone();
        // Renames stay within a mount: `mv` copies across (EXDEV).
        if sh.mount_of(&from) != sh.mount_of(&to) {
            return reply.error(Errno::EXDEV);
        }
        let how = sh.writes(&from);
        if how == Writes::No {
            return reply.error(Errno::EROFS);
        }
        let ino = lock(&sh.inodes).by_path.get(from.as_str()).copied();
        let writer = ino.and_then(|i| sh.live_writer(i));
        self.rt.spawn(async move {
            match sh.rename(&from, &to, replace, how, writer).await {
                Ok(()) => {
                    sh.renamed(&from, &to);
                    reply.ok()
                }
                Err(e) => reply.error(e),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_join_and_split() {
        assert_eq!(join("/", "data"), "/data");
        assert_eq!(join("/data", "x"), "/data/x");
        assert_eq!(parent_of("/data/x"), "/data");
        assert_eq!(parent_of("/data"), "/");
        assert_eq!(parent_of("/"), "/");
    }

    #[test]
    fn inodes_are_stable_and_expire() {
        let mut t = Inodes::new();
        assert_eq!(t.intern("/"), 1);
        let a = t.intern("/data/a");
        let b = t.note("/data/b", Kind::File(7, 1), Instant::now());
        assert_eq!((a, b), (2, 3));
        assert_eq!(t.intern("/data/a"), a);
        assert_eq!(t.path(b).as_deref(), Some("/data/b"));
        assert!(t.path(0).is_none() && t.path(99).is_none());
        assert_eq!(t.fresh(a, Duration::from_secs(5)), None, "never seen");
        let (kind, left) = t
            .fresh(b, Duration::from_secs(5))
            .unwrap_or((Kind::Dir(0), Duration::ZERO));
        assert_eq!(kind, Kind::File(7, 1));
        assert!(left > Duration::from_secs(4));
        assert_eq!(
            t.fresh(b, Duration::ZERO),
            None,
            "a zero TTL caches nothing"
        );
    }
}
