//! The file system behind `pagefs`: pagestore's logical namespace, read-only, through FUSE.
//!
//! - Inodes: one number per logical path, handed out on first sight (lookup or readdir) and kept
//!   for the life of the mount (numbers are never reused, so the generation is always 0).
//! - Attributes: from `Client::stat_path` or from a directory listing; the kernel caches them,
//!   and the entries, for the attribute TTL, and so does this table (a lookup right after a
//!   readdir costs no request). A file's mtime and ctime are the object's modification time in
//!   the store; directories (which object stores do not have) show the mount's start time.
//! - `statfs` (`df`) reports the cluster's cache: its capacity and the bytes cached, summed
//!   over the shards that answer (asked at most every [`STATFS_TTL`]); inode counts are 0,
//!   unknown.
//! - Open pins the object's version (`ObjectInfo`); every read of that handle is a
//!   `Client::read_at` of that version, so a handle never mixes versions. A read that comes back
//!   shorter than the pinned size promises is an error (ESTALE), never a silent short read.
//! - Directories are listed once at opendir; readdir serves that snapshot by offset, so a long
//!   directory read over many readdir calls is consistent.
//! - Concurrency: the FUSE threads only look things up in memory; every request that needs the
//!   network runs as a task on the tokio runtime and replies from there. No lock is held across
//!   network I/O, so one slow read never holds up another request.

use std::{
    collections::{HashMap, VecDeque},
    ffi::OsStr,
    sync::{
        atomic::{AtomicU64, Ordering},
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
    ufs::{system_time, MountTable, ObjectInfo},
    Client, Error,
};
use pagestore_protocol::frame::PathKind;
use tracing::{debug, info, warn};

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
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            attr_ttl: Duration::from_secs(10),
            readahead: 8 << 20,
            max_background: 64,
        }
    }
}

/// What a path is, as far as attributes go: a directory, or a file's size and modification
/// time (nanoseconds since the Unix epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Dir,
    File(u64, i64),
}

impl From<&PathKind> for Kind {
    fn from(k: &PathKind) -> Kind {
        match k {
            PathKind::Dir => Kind::Dir,
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
    /// The file id the last open of this inode pinned.
    opened_id: Option<u128>,
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
                opened_id: None,
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
            opened_id: None,
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

struct Shared {
    client: Arc<Client>,
    inodes: Mutex<Inodes>,
    files: Mutex<HashMap<u64, Arc<OpenFile>>>,
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
    /// The cluster's page size.
    page_size: u64,
    window: Mutex<Window>,
}

/// A sequential reader's pages. The kernel's read-ahead sends reads of at most 1 MiB, several
/// at once; fetching each as its own range would cost a request (and a node's work) per piece
/// of a 4 MiB page. A read that continues the previous one, or falls in a page already here,
/// is served from whole pages instead, and the next page is fetched ahead. Other reads (random
/// access) go straight to the range they want.
#[derive(Default)]
struct Window {
    /// Where the next sequential read starts.
    next: u64,
    /// Pages, oldest first; at most [`WINDOW_PAGES`].
    pages: VecDeque<(u64, PageFetch)>,
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
        Error::Exists(_) => Errno::EEXIST,
        Error::NotEmpty(_) => Errno::ENOTEMPTY,
        Error::NoSpace(_) => {
            warn!("{op} {path}: {e}");
            Errno::ENOSPC
        }
        Error::ReadOnly(_) => Errno::EROFS,
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
        let sequential = offset == w.next || w.pages.iter().any(|(p, _)| *p == first);
        w.next = offset + want;
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

    /// Mode bits, owner and group of `path`. Under a `file://` mount: the local file's (write
    /// and special bits removed: the mount is read-only), or no access at all (mode 0, root's)
    /// when the file cannot be examined here. Elsewhere (object stores have no per-user
    /// modes): readable by everyone who may use the mount, owned by the mounting user.
    fn perm(&self, path: Option<&str>, kind: Kind) -> (u16, u32, u32) {
        let open = match kind {
            Kind::Dir => 0o555,
            Kind::File(..) => 0o444,
        };
        let Some(path) = path.filter(|p| self.local.is_local(p)) else {
            return (open, self.uid, self.gid);
        };
        match self.local.local_attributes(path) {
            Ok(Some((mode, uid, gid))) => ((mode & 0o555) as u16, uid, gid),
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
            Kind::Dir => (FileType::Directory, 0, 2, self.time),
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

    fn fresh(&self, ino: u64) -> Option<(Kind, Duration)> {
        lock(&self.inodes).fresh(ino, self.ttl())
    }

    fn note(&self, path: &str, kind: Kind) -> u64 {
        lock(&self.inodes).note(path, kind, Instant::now())
    }

    fn next_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    async fn stat(&self, path: &str) -> Result<(u64, Kind), Error> {
        let kind = Kind::from(&self.client.stat_path(path).await?);
        Ok((self.note(path, kind), kind))
    }

    /// Lists `path` and returns its snapshot: `.`, `..`, then the entries in name order.
    async fn list(&self, ino: u64, path: &str) -> Result<Vec<DirItem>, Error> {
        let entries = self.client.list(path).await?;
        let now = Instant::now();
        let mut t = lock(&self.inodes);
        let parent = t.intern(parent_of(path));
        if let Some(n) = t.node(ino) {
            n.seen = Some((Kind::Dir, now));
        }
        let mut items = Vec::with_capacity(entries.len() + 2);
        for (name, ino) in [(".", ino), ("..", parent)] {
            items.push(DirItem {
                ino,
                kind: FileType::Directory,
                name: name.into(),
            });
        }
        for e in entries {
            let (kind, ft) = if e.is_dir {
                (Kind::Dir, FileType::Directory)
            } else {
                (Kind::File(e.size, e.mtime_ns), FileType::RegularFile)
            };
            items.push(DirItem {
                ino: t.note(&join(path, &e.name), kind, now),
                kind: ft,
                name: e.name,
            });
        }
        Ok(items)
    }
}

impl Filesystem for PageFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let o = &self.shared.options;
        if let Err(max) = config.set_max_readahead(o.readahead.max(1)) {
            let _ = config.set_max_readahead(max);
        }
        let _ = config.set_max_background(o.max_background.max(1));
        let _ = config.set_congestion_threshold((o.max_background / 4 * 3).max(1));
        // Lookups and readdirs of one directory may run in parallel.
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let (Some(dir), Some(name)) = (self.path(parent), name.to_str()) else {
            return reply.error(Errno::ENOENT);
        };
        let path = join(&dir, name);
        let sh = self.shared.clone();
        let known = lock(&sh.inodes).by_path.get(path.as_str()).copied();
        if let Some((ino, (kind, left))) = known.and_then(|i| Some((i, sh.fresh(i)?))) {
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
                    &sh.attr(ino, Some(path.as_str()), kind),
                    Generation(0),
                ),
                // A negative entry: the kernel remembers the miss for the TTL. Only a definite
                // "no such object" is cached; a store that cannot answer is EIO, asked again.
                Err(Error::NotFound(_)) => reply.entry(
                    &sh.ttl(),
                    &sh.attr(0, None, Kind::File(0, 0)),
                    Generation(0),
                ),
                Err(e) => reply.error(errno("lookup", &path, &e)),
            }
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let sh = self.shared.clone();
        if ino == INodeNo::ROOT {
            return reply.attr(&sh.ttl(), &sh.attr(1, Some("/"), Kind::Dir));
        }
        // An open handle answers for the version it pinned.
        if let Some(file) = fh.and_then(|fh| lock(&sh.files).get(&fh.0).cloned()) {
            let kind = Kind::File(file.info.size, file.info.mtime_ns);
            return reply.attr(
                &sh.ttl(),
                &sh.attr(ino.0, Some(file.info.path.as_str()), kind),
            );
        }
        let Some(path) = self.path(ino) else {
            return reply.error(Errno::ENOENT);
        };
        if let Some((kind, left)) = sh.fresh(ino.0) {
            return reply.attr(&left, &sh.attr(ino.0, Some(&*path), kind));
        }
        self.rt.spawn(async move {
            match sh.stat(&path).await {
                Ok((_, kind)) => reply.attr(&sh.ttl(), &sh.attr(ino.0, Some(&*path), kind)),
                Err(e) => reply.error(errno("getattr", &path, &e)),
            }
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        let Some(path) = self.path(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let sh = self.shared.clone();
        self.rt.spawn(async move {
            let info = match sh.client.stat(&path).await {
                Ok(i) => i,
                Err(e) => return reply.error(errno("open", &path, &e)),
            };
            let fh = sh.next_fh();
            // The kernel keeps its cached pages of the file only if this is the version they
            // came from, and must forget its cached size if this version has another one.
            let (keep, resized) = {
                let mut t = lock(&sh.inodes);
                let before = t.node(ino.0).and_then(|n| n.seen).map(|(k, _)| k);
                let now = Kind::File(info.size, info.mtime_ns);
                t.note(&path, now, Instant::now());
                let keep = t
                    .node(ino.0)
                    .map(|n| n.opened_id.replace(info.file_id) == Some(info.file_id))
                    .unwrap_or(false);
                (keep, before != Some(now))
            };
            lock(&sh.files).insert(
                fh,
                Arc::new(OpenFile {
                    info,
                    page_size: u64::from(sh.client.page_size()),
                    window: Mutex::new(Window::default()),
                }),
            );
            let flags = if keep {
                FopenFlags::FOPEN_KEEP_CACHE
            } else {
                FopenFlags::empty()
            };
            reply.opened(FileHandle(fh), flags);
            if resized || !keep {
                if let Some(n) = sh.notifier.get() {
                    // Attributes only (offset -1): the next read past the old size, or fstat,
                    // asks again and gets this version's size. Fails harmlessly if the kernel
                    // has already forgotten the inode.
                    let _ = n.inval_inode(ino, -1, 0);
                }
            }
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
        let Some(file) = lock(&self.shared.files).get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
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

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
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
        lock(&self.shared.files).remove(&fh.0);
        reply.ok();
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

    // Everything that would change the namespace is refused (the mount is read-only too, so
    // the kernel normally answers these itself).

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
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
            .unwrap_or((Kind::Dir, Duration::ZERO));
        assert_eq!(kind, Kind::File(7, 1));
        assert!(left > Duration::from_secs(4));
        assert_eq!(
            t.fresh(b, Duration::ZERO),
            None,
            "a zero TTL caches nothing"
        );
    }
}
