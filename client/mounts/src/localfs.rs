//! `file://` mounts confined to their root directory.
//!
//! [`LocalStore`] is the object store behind every `file://` mount. It holds an open descriptor
//! of the mount's root and resolves every object path *beneath* it:
//!
//! - Opens go through `openat2(root, rel, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//!   RESOLVE_NO_MAGICLINKS)` with `O_NOFOLLOW`. Where the kernel has no `openat2` (ENOSYS, or a
//!   seccomp filter answering EPERM), the path is walked one component at a time with
//!   `openat(dir, name, O_NOFOLLOW)`, which gives the same guarantee: a component is a single
//!   name (never `.`, `..` or empty), and a symlink anywhere is refused.
//! - Symlinks are not followed and not listed; other non-regular files (FIFOs, devices,
//!   sockets) are not objects either. An object path that crosses one is "not found".
//! - Writes go to a temporary file in the verified parent directory, which is then renamed
//!   (`renameat`) over the target inside that same directory. Parent directories are created
//!   one component at a time, each opened with `O_NOFOLLOW | O_DIRECTORY`. A target that is a
//!   directory holding nothing but empty directories (left behind when its last object was
//!   deleted) is removed first, as an object store has nothing at that name; one that holds
//!   anything else fails the write.
//! - Directories that hold no object at any depth (an empty one, or one holding only empty
//!   directories, symlinks or special files) are not listed, and a listing of one is empty, as
//!   in an object store: listings, `head` and `stat` of a logical directory agree.
//! - Deletes `unlinkat` the name in the verified parent directory, and only if it names a
//!   regular file.
//! - Every rename into a directory and every delete holds an exclusive `flock` on that
//!   directory, so that conditional writes are atomic among this store's writers (in every
//!   process): `PutMode::Create` renames with `RENAME_NOREPLACE`; `PutMode::Update`, a
//!   multipart write given a [`CommitMode`], and [`LocalStore::delete_if`] compare the current
//!   version tag and replace (or remove) the file under the lock.
//! - Object attributes (Content-Type, Cache-Control, Content-Disposition, Content-Encoding,
//!   Content-Language, user metadata) are kept in one user extended attribute of the file
//!   ([`ATTRIBUTES_XATTR`], JSON), written on the temporary file once all its bytes are, before
//!   the rename, and copied with the file. They carry a stamp of the bytes they were written
//!   with (the file's mtime and size then): a file rewritten in place since (which keeps its
//!   extended attributes) reads as having none, as an object replaced in a store would. A
//!   multipart write may be given its attributes late ([`LateAttributes`]), when its bytes
//!   are known. On a file system without user extended attributes they are not kept.
//! - Version tags (the e-tag) are `inode-mtime_ns-ctime_ns-size` (hex) from `fstat` of the
//!   opened file. A read reports the tag of the descriptor it reads and checks the tag again
//!   after reading: a file rewritten in place during the read is a
//!   [`object_store::Error::Precondition`], never a mix of two versions. The ctime cannot be
//!   set by a process, so a rewrite that restores size and mtime still changes the tag.
//!
//! Errors and `Display`/`Debug` name object paths relative to the root, never the root itself.
//! The blocking system calls run on tokio's blocking pool.

use std::{
    ffi::{CStr, CString},
    fs::File,
    io::{self, Write},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::fs::{FileExt, MetadataExt},
    },
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::{stream::BoxStream, StreamExt};
use object_store::{
    path::{Path, PathPart},
    Attribute, Attributes, CopyMode, CopyOptions, GetOptions, GetRange, GetResult,
    GetResultPayload, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMode,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result, UploadPart,
};

const STORE: &str = "LocalStore";

/// Prefix of the temporary files writes use (hidden from listings; a writer killed mid-write
/// leaves one, which `pages3` removes at its next start).
pub const TMP_PREFIX: &str = ".pagestore-tmp.";

/// Bytes read per blocking call when streaming a large range.
const CHUNK: u64 = 8 << 20;

/// Set once `openat2` turned out to be missing; then every open walks.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Reads of at most this many bytes run on the calling task's thread while the directory
/// answers them fast ([`InlineGate`]): handing such a read to the blocking pool and back costs
/// more than the read (a node's preload of 100,000 files of 1 KiB took 15-30% less time and CPU,
/// docs/BENCHMARKS.md). Stats (`head`) stay in the pool: with them inline, the cluster tests'
/// healthy clusters saw clients hedge stats to the store now and then on this 2-vCPU machine.
const INLINE_MAX: u64 = 256 << 10;

/// When reads of a directory may run on the calling thread. [`InlineGate::STRIKES`] reads in a
/// row that each took longer than [`InlineGate::SLOW`] (a network file system, a disk busy
/// elsewhere; one slow read alone may be the thread's preemption) send the directory's reads
/// to the blocking pool for [`InlineGate::BACK_OFF`]: a runtime thread must not wait on a slow
/// disk while other tasks wait on it.
#[derive(Debug, Default)]
pub struct InlineGate {
    /// Milliseconds since [`InlineGate::now_ms`]'s origin until which reads go to the pool.
    off_until_ms: AtomicU64,
    /// Slow inline reads in a row.
    strikes: AtomicU64,
}

impl InlineGate {
    /// A read slower than this is a strike.
    pub const SLOW: Duration = Duration::from_millis(2);
    /// Strikes in a row that turn inline reads off.
    pub const STRIKES: u64 = 3;
    /// For this long.
    pub const BACK_OFF: Duration = Duration::from_secs(10);

    /// Whether a read may run inline at `now_ms`.
    pub fn allows(&self, now_ms: u64) -> bool {
        now_ms >= self.off_until_ms.load(Ordering::Relaxed)
    }

    /// An inline read that took `took`, ending at `now_ms`.
    pub fn took(&self, took: Duration, now_ms: u64) {
        if took <= Self::SLOW {
            self.strikes.store(0, Ordering::Relaxed);
            return;
        }
        if self.strikes.fetch_add(1, Ordering::Relaxed) + 1 >= Self::STRIKES {
            self.strikes.store(0, Ordering::Relaxed);
            let until = now_ms + Self::BACK_OFF.as_millis() as u64;
            self.off_until_ms.fetch_max(until, Ordering::Relaxed);
            tracing::debug!(
                took_ms = took.as_millis() as u64,
                "a local directory's reads are slow: they go to the blocking pool for a while"
            );
        }
    }

    /// Monotonic milliseconds (from the first call in the process).
    pub fn now_ms() -> u64 {
        static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed().as_millis() as u64
    }
}

/// A local directory as an object store that never leaves that directory (see the module
/// documentation).
pub struct LocalStore {
    root: Arc<OwnedFd>,
    inline: InlineGate,
}

impl std::fmt::Display for LocalStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LocalStore")
    }
}

impl std::fmt::Debug for LocalStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LocalStore {{ .. }}")
    }
}

/// `open_how` of openat2(2).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;

fn cstr(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn fd_result(fd: libc::c_long) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel just returned this descriptor to us, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// openat(2) of one name in `dir`, never following a symlink in the last component.
fn openat_one(dir: &OwnedFd, name: &str, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: `dir` is an open descriptor for the duration of the call and `c` a NUL-terminated
    // string that outlives it.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    };
    fd_result(fd as libc::c_long)
}

/// The components of a relative object path, each a single acceptable name.
fn components(rel: &str) -> io::Result<Vec<&str>> {
    if rel.is_empty() {
        return Ok(Vec::new());
    }
    let parts: Vec<&str> = rel.split('/').collect();
    let bad = |p: &&str| p.is_empty() || *p == "." || *p == ".." || p.contains('\0');
    if parts.iter().any(bad) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    Ok(parts)
}

/// Opens `rel` beneath `root` with `flags`, refusing symlinks in every component and any path
/// that would leave `root`. `rel` empty opens the root itself.
fn open_beneath(root: &OwnedFd, rel: &str, flags: i32) -> io::Result<OwnedFd> {
    let parts = components(rel)?;
    let rel = if parts.is_empty() { "." } else { rel };
    if !NO_OPENAT2.load(Ordering::Relaxed) {
        let c = cstr(rel)?;
        let how = OpenHow {
            flags: (flags | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64,
            mode: 0,
            resolve: RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        };
        // SAFETY: openat2(2) reads `how` (a live `#[repr(C)]` open_how of the size passed) and
        // the NUL-terminated path; `root` stays open for the call.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                root.as_raw_fd(),
                c.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        match fd_result(fd) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EPERM)) => {
                NO_OPENAT2.store(true, Ordering::Relaxed);
            }
            r => return r,
        }
    }
    walk(root, &parts, flags)
}

/// The fallback of [`open_beneath`]: one `openat(O_NOFOLLOW)` per component.
fn walk(root: &OwnedFd, parts: &[&str], flags: i32) -> io::Result<OwnedFd> {
    let Some((last, dirs)) = parts.split_last() else {
        return openat_one(root, ".", flags, 0);
    };
    let mut cur: Option<OwnedFd> = None;
    for d in dirs {
        let next = openat_one(
            cur.as_ref().unwrap_or(root),
            d,
            libc::O_PATH | libc::O_DIRECTORY,
            0,
        )?;
        cur = Some(next);
    }
    openat_one(cur.as_ref().unwrap_or(root), last, flags, 0)
}

/// Opens (creating where missing) the directory `parts` beneath `root`, one component at a
/// time, never through a symlink.
fn make_dirs(root: &OwnedFd, parts: &[&str]) -> io::Result<OwnedFd> {
    let mut cur = openat_one(root, ".", libc::O_PATH | libc::O_DIRECTORY, 0)?;
    for d in parts {
        let flags = libc::O_PATH | libc::O_DIRECTORY;
        let next = match openat_one(&cur, d, flags, 0) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                let c = cstr(d)?;
                // SAFETY: `cur` is open and `c` NUL-terminated for the call.
                let r = unsafe { libc::mkdirat(cur.as_raw_fd(), c.as_ptr(), 0o755) };
                if r != 0 {
                    let e = io::Error::last_os_error();
                    if e.raw_os_error() != Some(libc::EEXIST) {
                        return Err(e);
                    }
                }
                openat_one(&cur, d, flags, 0)?
            }
            r => r?,
        };
        cur = next;
    }
    Ok(cur)
}

/// lstat of one name in `dir` (never follows a symlink).
fn stat_at(dir: &OwnedFd, name: &str) -> io::Result<libc::stat> {
    let c = cstr(name)?;
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `dir` is open, `c` NUL-terminated and `st` a writable stat buffer for the call.
    let r = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn is_reg(mode: u32) -> bool {
    mode & libc::S_IFMT == libc::S_IFREG
}

fn is_dir(mode: u32) -> bool {
    mode & libc::S_IFMT == libc::S_IFDIR
}

/// The names in the directory `dir` (an open directory descriptor), without `.` and `..`.
fn read_names(dir: OwnedFd) -> io::Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for_each_name(dir, |name, _| {
        out.push(name.to_vec());
        true
    })?;
    Ok(out)
}

/// Calls `f` with each name in the directory `dir` (without `.` and `..`) and its `d_type`,
/// until `f` answers `false`.
fn for_each_name(dir: OwnedFd, mut f: impl FnMut(&[u8], u8) -> bool) -> io::Result<()> {
    use std::os::fd::IntoRawFd;
    let raw = dir.into_raw_fd();
    // SAFETY: `raw` is an open directory descriptor we own; fdopendir takes it over (closedir
    // closes it), or fails and leaves it to us.
    let d = unsafe { libc::fdopendir(raw) };
    if d.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so `raw` is still ours to close.
        unsafe { libc::close(raw) };
        return Err(e);
    }
    let result = loop {
        // SAFETY: errno is thread-local; resetting it tells end-of-directory from an error.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: `d` is an open DIR stream until closedir below.
        let ent = unsafe { libc::readdir64(d) };
        if ent.is_null() {
            let e = io::Error::last_os_error();
            break match e.raw_os_error() {
                Some(0) | None => Ok(()),
                _ => Err(e),
            };
        }
        // SAFETY: readdir returned a valid entry whose d_name is NUL-terminated; it stays
        // valid until the next readdir on `d`, and `f` is done with the bytes before that.
        let (name, kind) = unsafe {
            (
                CStr::from_ptr((*ent).d_name.as_ptr()).to_bytes(),
                (*ent).d_type,
            )
        };
        if name != b"." && name != b".." && !f(name, kind) {
            break Ok(());
        }
    };
    // SAFETY: `d` came from fdopendir and is closed exactly once.
    unsafe { libc::closedir(d) };
    result
}

/// The name as an object path component, if a listing shows it: UTF-8, not a temporary file
/// of a write, and acceptable to object_store.
fn listable(raw: &[u8]) -> Option<&str> {
    let name = std::str::from_utf8(raw).ok()?;
    (!name.starts_with(TMP_PREFIX) && PathPart::parse(name).is_ok()).then_some(name)
}

/// Whether the directory `rel` beneath `root` holds an object (a regular file a listing shows)
/// at any depth. Object stores have no empty directories: one that holds no object is neither
/// listed nor a directory to `stat`, so listings, `stat` and readers agree (a directory emptied
/// on the store disappears instead of lingering as a name nothing can be read under). The walk
/// stops at the first object and holds one descriptor at a time. A subdirectory that cannot be
/// read counts as holding one (its own listing reports the error).
fn holds_object(root: &OwnedFd, rel: &str) -> bool {
    let mut todo = vec![rel.to_string()];
    while let Some(dir) = todo.pop() {
        let fd = match open_beneath(root, &dir, libc::O_RDONLY | libc::O_DIRECTORY) {
            Ok(fd) => fd,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::EXDEV)
                ) =>
            {
                continue
            }
            Err(_) => return true,
        };
        let Ok(probe) = fd.try_clone() else {
            return true;
        };
        let mut found = false;
        let mut unknown = false;
        let scanned = for_each_name(fd, |raw, kind| {
            let Some(name) = listable(raw) else {
                return true;
            };
            let mode = match kind {
                libc::DT_REG => libc::S_IFREG,
                libc::DT_DIR => libc::S_IFDIR,
                libc::DT_UNKNOWN => match stat_at(&probe, name) {
                    Ok(st) => st.st_mode & libc::S_IFMT,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return true,
                    Err(_) => {
                        unknown = true;
                        return false;
                    }
                },
                // Symlinks and special files are not objects.
                _ => return true,
            };
            if is_reg(mode) {
                found = true;
                return false;
            }
            if is_dir(mode) {
                todo.push(if dir.is_empty() {
                    name.to_string()
                } else {
                    format!("{dir}/{name}")
                });
            }
            true
        });
        if found || unknown || scanned.is_err() {
            return true;
        }
    }
    false
}

fn version_tag(st: &std::fs::Metadata) -> String {
    let ns = |s: i64, n: i64| (s as i128) * 1_000_000_000 + n as i128;
    format!(
        "{:x}-{:x}-{:x}-{:x}",
        st.ino(),
        ns(st.mtime(), st.mtime_nsec()),
        ns(st.ctime(), st.ctime_nsec()),
        st.size()
    )
}

fn meta_of(location: &Path, st: &std::fs::Metadata) -> ObjectMeta {
    let last_modified =
        chrono::DateTime::from_timestamp(st.mtime(), st.mtime_nsec().clamp(0, 999_999_999) as u32)
            .unwrap_or_default();
    ObjectMeta {
        location: location.clone(),
        last_modified,
        size: st.size(),
        e_tag: Some(version_tag(st)),
        version: None,
    }
}

/// One entry of a directory's listing.
enum Listed {
    /// A subdirectory that holds an object.
    Dir(Path),
    /// A regular file.
    File(ObjectMeta),
}

fn meta_of_stat(location: Path, st: &libc::stat) -> ObjectMeta {
    let ns = |s: i64, n: i64| (s as i128) * 1_000_000_000 + n as i128;
    let last_modified = chrono::DateTime::from_timestamp(
        st.st_mtime,
        st.st_mtime_nsec.clamp(0, 999_999_999) as u32,
    )
    .unwrap_or_default();
    ObjectMeta {
        location,
        last_modified,
        size: st.st_size as u64,
        e_tag: Some(format!(
            "{:x}-{:x}-{:x}-{:x}",
            st.st_ino,
            ns(st.st_mtime, st.st_mtime_nsec),
            ns(st.st_ctime, st.st_ctime_nsec),
            st.st_size as u64
        )),
        version: None,
    }
}

/// The object_store error for an I/O error at `path` (relative: no absolute path is named).
fn to_error(path: &Path, e: io::Error) -> object_store::Error {
    let p = path.to_string();
    match e.raw_os_error() {
        // A missing name, a file where a directory was needed, a symlink, a path leaving the
        // root, or a name longer than the file system holds: nothing there as far as this
        // store goes.
        Some(libc::ENOENT)
        | Some(libc::ENOTDIR)
        | Some(libc::ELOOP)
        | Some(libc::EXDEV)
        | Some(libc::ENAMETOOLONG) => object_store::Error::NotFound {
            path: p,
            source: Box::new(e),
        },
        Some(libc::EACCES) | Some(libc::EPERM) => object_store::Error::PermissionDenied {
            path: p,
            source: Box::new(e),
        },
        Some(libc::EEXIST) => object_store::Error::AlreadyExists {
            path: p,
            source: Box::new(e),
        },
        _ => object_store::Error::Generic {
            store: STORE,
            source: format!("{p}: {e}").into(),
        },
    }
}

fn not_found(path: &Path, why: &str) -> object_store::Error {
    object_store::Error::NotFound {
        path: path.to_string(),
        source: why.to_string().into(),
    }
}

fn changed(path: &Path) -> object_store::Error {
    object_store::Error::Precondition {
        path: path.to_string(),
        source: "the file changed while it was read".into(),
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| object_store::Error::Generic {
            store: STORE,
            source: Box::new(e),
        })?
}

/// Splits `rel` into its parent components and last name (`None` for the root).
fn split_parent(rel: &str) -> io::Result<Option<(Vec<&str>, &str)>> {
    let mut parts = components(rel)?;
    Ok(parts.pop().map(|last| (parts, last)))
}

fn tmp_name() -> String {
    format!(
        "{TMP_PREFIX}{}.{}",
        std::process::id(),
        TMP_SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

fn unlink_at(dir: &OwnedFd, name: &str, flags: i32) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: `dir` is open and `c` NUL-terminated for the call.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Renames `from` to `to`, both in `dir`; with `no_replace`, an existing `to` is EEXIST.
fn rename_in(dir: &OwnedFd, from: &str, to: &str, no_replace: bool) -> io::Result<()> {
    let (f, t) = (cstr(from)?, cstr(to)?);
    let flags = if no_replace {
        libc::RENAME_NOREPLACE
    } else {
        0
    };
    // SAFETY: `dir` is open and both names NUL-terminated for the call.
    let r = unsafe {
        libc::renameat2(
            dir.as_raw_fd(),
            f.as_ptr(),
            dir.as_raw_fd(),
            t.as_ptr(),
            flags,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Removes the directory `name` in `dir` and the directories beneath it, if none of them holds
/// anything but empty directories; otherwise fails (ENOTEMPTY, or ENOTDIR for a non-directory
/// found in it) and leaves what it could not remove. Symlinks are not followed.
fn remove_empty_tree(dir: &OwnedFd, name: &str) -> io::Result<()> {
    let sub = openat_one(dir, name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    for raw in read_names(sub.try_clone()?)? {
        let child =
            std::str::from_utf8(&raw).map_err(|_| io::Error::from_raw_os_error(libc::ENOTEMPTY))?;
        remove_empty_tree(&sub, child)?;
    }
    unlink_at(dir, name, libc::AT_REMOVEDIR)
}

/// A temporary file in a verified directory, removed on drop unless it was renamed.
struct TmpFile {
    dir: Arc<OwnedFd>,
    name: String,
    file: Arc<File>,
    done: bool,
}

impl TmpFile {
    fn create(dir: Arc<OwnedFd>) -> io::Result<TmpFile> {
        let name = tmp_name();
        let fd = openat_one(
            &dir,
            &name,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o644,
        )?;
        Ok(TmpFile {
            dir,
            name,
            file: Arc::new(File::from(fd)),
            done: false,
        })
    }

    /// Makes the data durable and renames the file to `target` in its directory (under the
    /// directory's lock, after checking `mode`); returns the new object's metadata.
    fn commit(mut self, location: &Path, target: &str, mode: &PutMode) -> Result<ObjectMeta> {
        self.file.sync_all().map_err(|e| to_error(location, e))?;
        let _lock = lock_dir(&self.dir).map_err(|e| to_error(location, e))?;
        check_version(&self.dir, target, location, mode)?;
        let no_replace = matches!(mode, PutMode::Create);
        match rename_in(&self.dir, &self.name, target, no_replace) {
            // The name is a directory. One that holds no object is not there for an object
            // store (a key once written beneath it and deleted since leaves it behind): it is
            // removed and the object takes its place. One that still holds anything is left
            // alone and the write fails.
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::EISDIR | libc::EEXIST))
                    && stat_at(&self.dir, target).is_ok_and(|st| is_dir(st.st_mode)) =>
            {
                remove_empty_tree(&self.dir, target).map_err(|_| to_error(location, e))?;
                rename_in(&self.dir, &self.name, target, no_replace)
                    .map_err(|e| to_error(location, e))?;
            }
            r => r.map_err(|e| to_error(location, e))?,
        }
        self.done = true;
        // The rename may change the ctime: the tag is taken afterwards.
        let st = self.file.metadata().map_err(|e| to_error(location, e))?;
        Ok(meta_of(location, &st))
    }
}

impl Drop for TmpFile {
    fn drop(&mut self) {
        if !self.done {
            let _ = unlink_at(&self.dir, &self.name, 0);
        }
    }
}

/// The mode a multipart write of a [`LocalStore`] completes with, given as an extension of its
/// `PutMultipartOptions` (other stores ignore it: use it only with this store).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitMode(pub PutMode);

/// An exclusive `flock` of the directory `dir`, held until the returned descriptor is dropped.
fn lock_dir(dir: &OwnedFd) -> io::Result<OwnedFd> {
    let fd = openat_one(dir, ".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    loop {
        // SAFETY: `fd` is an open descriptor for the call.
        if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(fd);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The version tag of the regular file `name` in `dir` (`None`: nothing, or not a file).
fn tag_at(dir: &OwnedFd, name: &str, location: &Path) -> Result<Option<String>> {
    match stat_at(dir, name) {
        Ok(st) if is_reg(st.st_mode) => Ok(meta_of_stat(location.clone(), &st).e_tag),
        Ok(_) => Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(to_error(location, e)),
    }
}

/// Checks a `PutMode::Update` against the file `name` in `dir` (the caller holds the
/// directory's lock); other modes pass.
fn check_version(dir: &OwnedFd, name: &str, location: &Path, mode: &PutMode) -> Result<()> {
    let PutMode::Update(v) = mode else {
        return Ok(());
    };
    let want = v.e_tag.as_deref().map(|t| t.trim_matches('"'));
    let have = tag_at(dir, name, location)?;
    if want.is_none() || have.as_deref() != want {
        return Err(object_store::Error::Precondition {
            path: location.to_string(),
            source: "the object has another version".into(),
        });
    }
    Ok(())
}

/// The user extended attribute that holds an object's attributes (a JSON object).
pub const ATTRIBUTES_XATTR: &str = "user.pagestore.attributes";

/// The most bytes of attributes kept (S3 allows 2 KB of user metadata; ext4 keeps an
/// attribute in one block).
const MAX_ATTRIBUTES: usize = 3500;

fn attribute_name(a: &Attribute) -> Option<String> {
    Some(match a {
        Attribute::ContentType => "Content-Type".into(),
        Attribute::CacheControl => "Cache-Control".into(),
        Attribute::ContentDisposition => "Content-Disposition".into(),
        Attribute::ContentEncoding => "Content-Encoding".into(),
        Attribute::ContentLanguage => "Content-Language".into(),
        Attribute::Metadata(k) => format!("meta:{k}"),
        _ => return None,
    })
}

fn attribute_of(name: &str) -> Option<Attribute> {
    Some(match name {
        "Content-Type" => Attribute::ContentType,
        "Cache-Control" => Attribute::CacheControl,
        "Content-Disposition" => Attribute::ContentDisposition,
        "Content-Encoding" => Attribute::ContentEncoding,
        "Content-Language" => Attribute::ContentLanguage,
        n => Attribute::Metadata(n.strip_prefix("meta:")?.to_string().into()),
    })
}

/// The JSON key of the stamp of the bytes the attributes were written with (never an
/// attribute's name: those are the headers' names and `meta:` ones).
const STAMP_KEY: &str = "@written";

/// Room kept in [`MAX_ATTRIBUTES`] for the stamp.
const STAMP_ROOM: usize = 64;

/// The stamp of the bytes of the file `st` describes: its mtime (ns) and size, in hex. A
/// rewrite in place changes the mtime (or the size); a copy that keeps both keeps the bytes.
fn stamp(st: &std::fs::Metadata) -> String {
    let ns = (st.mtime() as i128) * 1_000_000_000 + st.mtime_nsec() as i128;
    format!("{ns:x}-{:x}", st.size())
}

/// Attributes ready to be kept: their JSON form, without its stamp (`None`: nothing to keep).
struct Blob(Option<serde_json::Map<String, serde_json::Value>>);

impl Blob {
    /// `attrs`' JSON form; over [`MAX_ATTRIBUTES`] (with the stamp) is an error.
    fn of(attrs: &Attributes) -> Result<Blob> {
        let map: serde_json::Map<String, serde_json::Value> = attrs
            .iter()
            .filter_map(|(k, v)| Some((attribute_name(k)?, serde_json::Value::from(v.as_ref()))))
            .collect();
        if map.is_empty() {
            return Ok(Blob(None));
        }
        let len = serde_json::to_vec(&map).map_or(usize::MAX, |b| b.len());
        if len > MAX_ATTRIBUTES - STAMP_ROOM {
            return Err(object_store::Error::Generic {
                store: STORE,
                source: format!(
                    "object attributes over {} bytes",
                    MAX_ATTRIBUTES - STAMP_ROOM
                )
                .into(),
            });
        }
        Ok(Blob(Some(map)))
    }

    /// Sets the attributes on `file`, whose bytes are all written, stamped with them.
    fn set_on(&self, file: &File, location: &Path) -> Result<()> {
        let Some(map) = &self.0 else { return Ok(()) };
        let st = file.metadata().map_err(|e| to_error(location, e))?;
        let mut map = map.clone();
        map.insert(STAMP_KEY.into(), stamp(&st).into());
        let bytes = serde_json::to_vec(&map).map_err(|e| object_store::Error::Generic {
            store: STORE,
            source: Box::new(e),
        })?;
        set_attributes(file, &bytes, location)
    }
}

/// The attributes in `bytes` kept with the file `file`: none when they were stamped with other
/// bytes than the file's now (it was rewritten in place since); unstamped ones (kept by an
/// older version) as they are.
fn decode_attributes(bytes: &[u8], file: &File, location: &Path) -> Result<Attributes> {
    let mut out = Attributes::new();
    let Ok(serde_json::Value::Object(map)) = serde_json::from_slice(bytes) else {
        return Ok(out);
    };
    if let Some(written) = map.get(STAMP_KEY) {
        let st = file.metadata().map_err(|e| to_error(location, e))?;
        if written.as_str() != Some(stamp(&st).as_str()) {
            tracing::debug!(path = %location, "attributes of bytes rewritten since: not kept");
            return Ok(out);
        }
    }
    for (k, v) in map {
        if let (Some(a), serde_json::Value::String(v)) = (attribute_of(&k), v) {
            out.insert(a, v.into());
        }
    }
    Ok(out)
}

/// Attributes a multipart write of a [`LocalStore`] takes at its completion instead of the
/// ones it was started with, if they were set by then: given as an extension of its
/// `PutMultipartOptions` and set by the writer once it knows them (a digest of the bytes).
/// Other stores ignore it: they keep the attributes the write started with.
#[derive(Clone, Debug, Default)]
pub struct LateAttributes(Arc<std::sync::Mutex<Option<Attributes>>>);

impl LateAttributes {
    /// The attributes the write completes with.
    pub fn set(&self, attrs: Attributes) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(attrs);
    }

    fn take(&self) -> Option<Attributes> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// Sets the attributes blob on `file`. A file system without user extended attributes keeps
/// none (not an error: the object itself is written).
fn set_attributes(file: &File, blob: &[u8], location: &Path) -> Result<()> {
    let name = cstr(ATTRIBUTES_XATTR).map_err(|e| to_error(location, e))?;
    // SAFETY: `file` is open, `name` NUL-terminated and `blob` a live buffer of the length
    // passed, for the call.
    let r = unsafe {
        libc::fsetxattr(
            file.as_raw_fd(),
            name.as_ptr(),
            blob.as_ptr().cast(),
            blob.len(),
            0,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        if matches!(e.raw_os_error(), Some(libc::ENOTSUP | libc::EPERM)) {
            tracing::debug!(path = %location, "the file system keeps no user extended attributes");
            return Ok(());
        }
        return Err(to_error(location, e));
    }
    Ok(())
}

/// The attributes blob of `file` (`None`: none kept).
fn get_attributes(file: &File, location: &Path) -> Result<Option<Vec<u8>>> {
    let name = cstr(ATTRIBUTES_XATTR).map_err(|e| to_error(location, e))?;
    let mut buf = vec![0u8; MAX_ATTRIBUTES + 1];
    // SAFETY: `file` is open, `name` NUL-terminated and `buf` a writable buffer of the length
    // passed, for the call.
    let n = unsafe {
        libc::fgetxattr(
            file.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODATA | libc::ENOTSUP | libc::ERANGE) => Ok(None),
            _ => Err(to_error(location, e)),
        };
    }
    buf.truncate(n as usize);
    Ok(Some(buf))
}

/// The verified parent directory of `location` (created where missing) and the last name.
fn parent_for_write(root: &OwnedFd, location: &Path) -> Result<(Arc<OwnedFd>, String)> {
    let rel = location.as_ref();
    let Some((dirs, name)) = split_parent(rel).map_err(|e| to_error(location, e))? else {
        return Err(object_store::Error::Generic {
            store: STORE,
            source: "cannot write the root directory".into(),
        });
    };
    let dir = make_dirs(root, &dirs).map_err(|e| to_error(location, e))?;
    Ok((Arc::new(dir), name.to_string()))
}

fn put_result(meta: ObjectMeta) -> PutResult {
    PutResult {
        e_tag: meta.e_tag,
        version: None,
        extensions: Default::default(),
    }
}

impl LocalStore {
    /// A store over the directory `dir` (opened now; later renames of `dir` itself do not move
    /// the store).
    pub fn new(dir: &std::path::Path) -> io::Result<LocalStore> {
        let c = CString::new(dir.as_os_str().as_encoded_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: `c` is NUL-terminated for the call.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        Ok(LocalStore {
            root: Arc::new(fd_result(fd as libc::c_long)?),
            inline: InlineGate::default(),
        })
    }

    /// The real path of the root directory (from the open descriptor, so it is the directory
    /// this store serves even if a path component was swapped since).
    pub fn real_path(&self) -> io::Result<std::path::PathBuf> {
        std::fs::read_link(format!("/proc/self/fd/{}", self.root.as_raw_fd()))
    }

    /// Mode, owner and group of the regular file or directory at `location`, without following
    /// symlinks (`None`: nothing there, or something that is not an object or directory).
    pub fn attributes(&self, location: &Path) -> io::Result<Option<(u32, u32, u32)>> {
        match open_beneath(&self.root, location.as_ref(), libc::O_PATH) {
            Ok(fd) => {
                let st = File::from(fd).metadata()?;
                let m = st.mode();
                Ok((is_reg(m) || is_dir(m)).then_some((m & 0o7777, st.uid(), st.gid())))
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::EXDEV)
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The attributes kept with the object at `location` (empty where none were kept).
    pub async fn object_attributes(&self, location: &Path) -> Result<Attributes> {
        let (root, location) = (self.root.clone(), location.clone());
        blocking(move || {
            let (file, _) = LocalStore::open_file(&root, &location)?;
            match get_attributes(&file, &location)? {
                Some(b) => decode_attributes(&b, &file, &location),
                None => Ok(Attributes::new()),
            }
        })
        .await
    }

    /// Deletes the object at `location` if its version tag is `e_tag` (quotes ignored), as one
    /// step among this store's writers; another version is [`object_store::Error::Precondition`],
    /// nothing there [`object_store::Error::NotFound`].
    pub async fn delete_if(&self, location: &Path, e_tag: &str) -> Result<()> {
        let (root, location, want) = (self.root.clone(), location.clone(), e_tag.to_string());
        blocking(move || delete_one(&root, &location, Some(&want))).await
    }

    /// Opens the regular file at `location` for reading.
    fn open_file(root: &OwnedFd, location: &Path) -> Result<(Arc<File>, ObjectMeta)> {
        // O_NONBLOCK: opening a FIFO must not hang (it is refused below anyway).
        let fd = open_beneath(root, location.as_ref(), libc::O_RDONLY | libc::O_NONBLOCK)
            .map_err(|e| to_error(location, e))?;
        let file = File::from(fd);
        let st = file.metadata().map_err(|e| to_error(location, e))?;
        if !st.is_file() {
            return Err(not_found(location, "not a regular file"));
        }
        Ok((Arc::new(file), meta_of(location, &st)))
    }

    /// The names in the directory `prefix` and a descriptor of it to stat them through;
    /// `None` when nothing (or no directory, or a symlink) is there: an empty listing.
    fn open_listing(root: &OwnedFd, prefix: &Path) -> Result<Option<(Vec<Vec<u8>>, OwnedFd)>> {
        let fd = match open_beneath(root, prefix.as_ref(), libc::O_RDONLY | libc::O_DIRECTORY) {
            Ok(fd) => fd,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::EXDEV)
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(to_error(prefix, e)),
        };
        let probe = fd.try_clone().map_err(|e| to_error(prefix, e))?;
        let names = read_names(fd).map_err(|e| to_error(prefix, e))?;
        Ok(Some((names, probe)))
    }

    /// What the listing of `prefix` shows for `name` (a listable name read from `probe`, the
    /// directory): a directory that holds an object, a regular file, or nothing (gone since
    /// the directory was read, a symlink, a special file, a directory without objects).
    fn list_entry(
        root: &OwnedFd,
        probe: &OwnedFd,
        prefix: &Path,
        name: &str,
    ) -> Result<Option<Listed>> {
        let Ok(part) = PathPart::parse(name) else {
            return Ok(None);
        };
        let st = match stat_at(probe, name) {
            Ok(st) => st,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(to_error(prefix, e)),
        };
        let child = prefix.clone().join(part);
        Ok(if is_dir(st.st_mode) {
            // Only directories that hold an object somewhere beneath them are listed.
            holds_object(root, child.as_ref()).then_some(Listed::Dir(child))
        } else if is_reg(st.st_mode) {
            Some(Listed::File(meta_of_stat(child, &st)))
        } else {
            None
        })
    }

    fn list_dir(root: &OwnedFd, prefix: &Path) -> Result<(Vec<Path>, Vec<ObjectMeta>)> {
        let (mut dirs, mut files) = (Vec::new(), Vec::new());
        let Some((names, probe)) = Self::open_listing(root, prefix)? else {
            return Ok((dirs, files));
        };
        for name in names.iter().filter_map(|raw| listable(raw)) {
            match Self::list_entry(root, &probe, prefix, name)? {
                Some(Listed::Dir(d)) => dirs.push(d),
                Some(Listed::File(f)) => files.push(f),
                None => {}
            }
        }
        Ok((dirs, files))
    }

    /// The first `max` entries (at least one) of what `list_with_delimiter(prefix)` gives, in
    /// name order, and whether names follow them: the directory's names are read and sorted,
    /// but only those entries are examined, so the head of a directory of 100,000 files comes
    /// in a fraction of the time its whole listing takes. Every name that follows is greater
    /// than the last entry's.
    pub async fn list_head(
        &self,
        prefix: &Path,
        max: usize,
    ) -> Result<(Vec<Path>, Vec<ObjectMeta>, bool)> {
        let (root, prefix, max) = (self.root.clone(), prefix.clone(), max.max(1));
        blocking(move || {
            let (mut dirs, mut files) = (Vec::new(), Vec::new());
            let Some((names, probe)) = Self::open_listing(&root, &prefix)? else {
                return Ok((dirs, files, false));
            };
            let mut names: Vec<&str> = names.iter().filter_map(|raw| listable(raw)).collect();
            names.sort_unstable();
            for name in names {
                if dirs.len() + files.len() == max {
                    return Ok((dirs, files, true));
                }
                match Self::list_entry(&root, &probe, &prefix, name)? {
                    Some(Listed::Dir(d)) => dirs.push(d),
                    Some(Listed::File(f)) => files.push(f),
                    None => {}
                }
            }
            Ok((dirs, files, false))
        })
        .await
    }

    fn list_all(root: &OwnedFd, prefix: &Path) -> Result<Vec<ObjectMeta>> {
        let mut out = Vec::new();
        let mut todo = vec![prefix.clone()];
        while let Some(dir) = todo.pop() {
            let (dirs, files) = Self::list_dir(root, &dir)?;
            out.extend(files);
            todo.extend(dirs);
        }
        Ok(out)
    }
}

/// Reads `range` of `file` (whose metadata was `meta`), then checks that the file still has
/// the version it had when opened.
fn read_checked(
    file: &File,
    location: &Path,
    meta: &ObjectMeta,
    range: std::ops::Range<u64>,
) -> Result<Bytes> {
    let len = usize::try_from(range.end - range.start).map_err(|_| changed(location))?;
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        match file.read_at(&mut buf[done..], range.start + done as u64) {
            Ok(0) => return Err(changed(location)),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(to_error(location, e)),
        }
    }
    let st = file.metadata().map_err(|e| to_error(location, e))?;
    if Some(version_tag(&st)) != meta.e_tag {
        return Err(changed(location));
    }
    Ok(buf.into())
}

#[async_trait]
impl ObjectStore for LocalStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let mode = opts.mode;
        let attrs = Blob::of(&opts.attributes)?;
        let (root, location) = (self.root.clone(), location.clone());
        blocking(move || {
            let (dir, name) = parent_for_write(&root, &location)?;
            let tmp = TmpFile::create(dir).map_err(|e| to_error(&location, e))?;
            for b in &payload {
                (&*tmp.file)
                    .write_all(b)
                    .map_err(|e| to_error(&location, e))?;
            }
            attrs.set_on(&tmp.file, &location)?;
            tmp.commit(&location, &name, &mode).map(put_result)
        })
        .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        let mode = opts
            .extensions
            .get::<CommitMode>()
            .map_or(PutMode::Overwrite, |m| m.0.clone());
        // Checked now, kept at the completion (stamped with the bytes written by then).
        let attrs = Blob::of(&opts.attributes)?;
        let late = opts.extensions.get::<LateAttributes>().cloned();
        let (root, location) = (self.root.clone(), location.clone());
        blocking(move || {
            let (dir, name) = parent_for_write(&root, &location)?;
            let tmp = TmpFile::create(dir).map_err(|e| to_error(&location, e))?;
            Ok(Box::new(LocalUpload {
                location,
                name,
                tmp: Some(tmp),
                offset: 0,
                mode,
                attrs,
                late,
            }) as Box<dyn MultipartUpload>)
        })
        .await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let (root, location) = (self.root.clone(), location.clone());
        let small = !options.head
            && matches!(&options.range, Some(GetRange::Bounded(r)) if r.end.saturating_sub(r.start) <= INLINE_MAX);
        let get = move || {
            let (file, meta) = LocalStore::open_file(&root, &location)?;
            options.check_preconditions(&meta)?;
            let range = match &options.range {
                Some(r) => r
                    .as_range(meta.size)
                    .map_err(|e| object_store::Error::Generic {
                        store: STORE,
                        source: Box::new(e),
                    })?,
                None => 0..meta.size,
            };
            let payload = if options.head {
                futures_util::stream::empty().boxed()
            } else if range.end - range.start <= CHUNK {
                let b = read_checked(&file, &location, &meta, range.clone())?;
                futures_util::stream::once(async move { Ok(b) }).boxed()
            } else {
                chunks(file, location.clone(), meta.clone(), range.clone())
            };
            Ok(GetResult {
                payload: GetResultPayload::Stream(payload),
                meta,
                range,
                attributes: Default::default(),
                extensions: Default::default(),
            })
        };
        if small && self.inline.allows(InlineGate::now_ms()) {
            let t0 = Instant::now();
            let r = get();
            self.inline.took(t0.elapsed(), InlineGate::now_ms());
            r
        } else {
            blocking(get).await
        }
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let root = self.root.clone();
        locations
            .then(move |loc| {
                let root = root.clone();
                async move {
                    let location = loc?;
                    blocking(move || delete_one(&root, &location, None).map(|_| location)).await
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        let (root, prefix) = (self.root.clone(), prefix.cloned().unwrap_or_default());
        futures_util::stream::once(blocking(move || LocalStore::list_all(&root, &prefix)))
            .map(|r| match r {
                Ok(v) => futures_util::stream::iter(v.into_iter().map(Ok)).boxed(),
                Err(e) => futures_util::stream::once(async move { Err(e) }).boxed(),
            })
            .flatten()
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let (root, prefix) = (self.root.clone(), prefix.cloned().unwrap_or_default());
        let (common_prefixes, objects) =
            blocking(move || LocalStore::list_dir(&root, &prefix)).await?;
        Ok(ListResult {
            common_prefixes,
            objects,
            extensions: Default::default(),
        })
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        let mode = match options.mode {
            CopyMode::Create => PutMode::Create,
            _ => PutMode::Overwrite,
        };
        let (root, from, to) = (self.root.clone(), from.clone(), to.clone());
        blocking(move || {
            let (src, meta) = LocalStore::open_file(&root, &from)?;
            let (dir, name) = parent_for_write(&root, &to)?;
            let tmp = TmpFile::create(dir).map_err(|e| to_error(&to, e))?;
            let copied = io::copy(&mut &*src, &mut &*tmp.file).map_err(|e| to_error(&from, e))?;
            let st = src.metadata().map_err(|e| to_error(&from, e))?;
            if copied != meta.size || Some(version_tag(&st)) != meta.e_tag {
                return Err(changed(&from));
            }
            // The source's attributes (if they still describe its bytes), stamped anew with
            // the copy's.
            if let Some(blob) = get_attributes(&src, &from)? {
                let attrs = decode_attributes(&blob, &src, &from)?;
                Blob::of(&attrs)?.set_on(&tmp.file, &to)?;
            }
            tmp.commit(&to, &name, &mode).map(|_| ())
        })
        .await
    }
}

fn delete_one(root: &OwnedFd, location: &Path, expected: Option<&str>) -> Result<()> {
    let Some((dirs, name)) = split_parent(location.as_ref()).map_err(|e| to_error(location, e))?
    else {
        return Err(not_found(location, "the root is not an object"));
    };
    let dir = open_beneath(root, &dirs.join("/"), libc::O_PATH | libc::O_DIRECTORY)
        .map_err(|e| to_error(location, e))?;
    let _lock = lock_dir(&dir).map_err(|e| to_error(location, e))?;
    let st = stat_at(&dir, name).map_err(|e| to_error(location, e))?;
    if !is_reg(st.st_mode) {
        return Err(not_found(location, "not a regular file"));
    }
    if let Some(want) = expected {
        if meta_of_stat(location.clone(), &st).e_tag.as_deref() != Some(want.trim_matches('"')) {
            return Err(object_store::Error::Precondition {
                path: location.to_string(),
                source: "the object has another version".into(),
            });
        }
    }
    unlink_at(&dir, name, 0).map_err(|e| to_error(location, e))
}

/// A large range, read `CHUNK` bytes per blocking call; the version is checked after every
/// chunk.
fn chunks(
    file: Arc<File>,
    location: Path,
    meta: ObjectMeta,
    range: std::ops::Range<u64>,
) -> BoxStream<'static, Result<Bytes>> {
    futures_util::stream::try_unfold(range.start, move |at| {
        let (file, location, meta) = (file.clone(), location.clone(), meta.clone());
        let end = range.end;
        async move {
            if at >= end {
                return Ok(None);
            }
            let stop = (at + CHUNK).min(end);
            let b = blocking(move || read_checked(&file, &location, &meta, at..stop)).await?;
            Ok(Some((b, stop)))
        }
    })
    .boxed()
}

/// A multipart write: parts go into a temporary file in the verified parent directory at the
/// offsets they were handed in; `complete` renames it over the target.
struct LocalUpload {
    location: Path,
    name: String,
    tmp: Option<TmpFile>,
    offset: u64,
    mode: PutMode,
    /// The attributes it started with, and those it may be given by its completion.
    attrs: Blob,
    late: Option<LateAttributes>,
}

impl std::fmt::Debug for LocalUpload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LocalUpload({})", self.location)
    }
}

#[async_trait]
impl MultipartUpload for LocalUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let Some(tmp) = &self.tmp else {
            return Box::pin(futures_util::future::ready(Err(
                object_store::Error::Generic {
                    store: STORE,
                    source: "the upload is finished".into(),
                },
            )));
        };
        let (file, location, at) = (tmp.file.clone(), self.location.clone(), self.offset);
        self.offset += data.content_length() as u64;
        Box::pin(blocking(move || {
            let mut off = at;
            for b in &data {
                file.write_all_at(b, off)
                    .map_err(|e| to_error(&location, e))?;
                off += b.len() as u64;
            }
            Ok(())
        }))
    }

    async fn complete(&mut self) -> Result<PutResult> {
        let tmp = self
            .tmp
            .take()
            .ok_or_else(|| object_store::Error::Generic {
                store: STORE,
                source: "the upload is finished".into(),
            })?;
        let (location, name, mode) = (self.location.clone(), self.name.clone(), self.mode.clone());
        let attrs = match self.late.as_ref().and_then(LateAttributes::take) {
            Some(a) => Blob::of(&a)?,
            None => std::mem::replace(&mut self.attrs, Blob(None)),
        };
        blocking(move || {
            attrs.set_on(&tmp.file, &location)?;
            tmp.commit(&location, &name, &mode).map(put_result)
        })
        .await
    }

    async fn abort(&mut self) -> Result<()> {
        if let Some(tmp) = self.tmp.take() {
            blocking(move || {
                drop(tmp);
                Ok(())
            })
            .await?;
        }
        Ok(())
    }
}

impl Drop for LocalUpload {
    fn drop(&mut self) {
        // An upload dropped without complete or abort leaves nothing behind.
        self.tmp.take();
    }
}
