//! Writes through `pagefs`, mounted for real (FUSE, as root) over three `pagestored` processes
//! with a `write=back` mount (two write replicas) and a `write=through` one:
//!
//! - a 1 GB checkpoint saved as checkpoint savers do (a temporary name, fsync, `os.replace`)
//!   reads back byte-exact through another mount, the client library and `pagectl cat`,
//!   before and after `pagectl sync`, and the store then holds exactly those bytes;
//! - coreutils (cp, dd with seek, truncate, mv, rm, mkdir, rmdir) leave on the mount what they
//!   leave on a local disk, with the same exit statuses, and the store gets the same files;
//! - errno as POSIX says (EEXIST, ENOTEMPTY, EXDEV, EROFS, EISDIR, ENOTDIR, ENAMETOOLONG);
//!   random writes equal a local reference file; another mount sees a file after its writer's
//!   fsync and close; a `write=through` mount's files reach the store at close.
//!
//! Needs root, /dev/fuse and python3 (as in CI).
#![allow(clippy::unwrap_used)]

mod mount;

use std::{
    io::Read,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{RwLock, RwLockReadGuard, RwLockWriteGuard},
    time::Instant,
};

use mount::Mount;
use pagestore_client::{ClientOptions, Error};
use pagestore_protocol::frame::FileState;
use pagestore_testkit::fixture::{self as common, bytes, Cluster};
use sha2::{Digest, Sha256};

const MIB: usize = 1 << 20;

/// A cluster of three nodes (write replicas 2) with `/ck` written back to `store/ck` and
/// `/data` written through to `store/data`, `cache` bytes of cache each and `extra` flags.
fn cluster(cache: &str, extra: &[&str]) -> (Cluster, PathBuf) {
    let (dir, mut s) = common::settings();
    let store = dir.path().join("store");
    for d in ["ck", "data"] {
        std::fs::create_dir_all(store.join(d)).unwrap();
    }
    s.mounts = vec![
        format!("/ck=file://{}?write=back", store.join("ck").display()),
        format!("/data=file://{}", store.join("data").display()),
    ];
    s.cache_size = cache.into();
    s.extra = ["--write-replicas", "2"]
        .iter()
        .chain(extra)
        .map(|a| a.to_string())
        .collect();
    (Cluster::start(dir, s), store)
}

/// The disk the clusters' caches are allocated on (whole, at start) is shared: the 1 GB
/// checkpoint test runs alone, the others together.
static DISK: RwLock<()> = RwLock::new(());

fn disk_alone() -> RwLockWriteGuard<'static, ()> {
    DISK.write().unwrap_or_else(|e| e.into_inner())
}

fn disk_shared() -> RwLockReadGuard<'static, ()> {
    DISK.read().unwrap_or_else(|e| e.into_inner())
}

/// Bytes free for unprivileged use in the filesystem holding `p`.
fn free_bytes(p: &Path) -> u64 {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path and `st` a statvfs the call fills in.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; both pointers are valid for the call.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    assert_eq!(rc, 0, "statvfs {}", p.display());
    st.f_bavail * st.f_frsize
}

fn sha256_stream(mut r: impl Read) -> String {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 4 * MIB];
    loop {
        let n = r.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_file(p: &Path) -> String {
    sha256_stream(std::fs::File::open(p).unwrap())
}

/// The SHA-256 of what `pagectl cat PATH` prints (streamed, not kept).
fn sha256_pagectl_cat(c: &Cluster, path: &str) -> String {
    let mut child = Command::new(common::binary("pagectl"))
        .arg("--cluster")
        .arg(&c.members)
        .arg("--tls-dir")
        .arg(&c.ca_dir)
        .args(["cat", path])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let sum = sha256_stream(child.stdout.take().unwrap());
    assert!(child.wait().unwrap().success(), "pagectl cat {path}");
    sum
}

fn python(script: &str, args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python3 failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn errno<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.unwrap_err().raw_os_error().unwrap()
}

/// What torch.save-like checkpoint savers do: write a temporary file, fsync it, rename it
/// over the final name. Prints the SHA-256 of what it wrote (a deterministic random stream,
/// in writes that do not line up with pages).
const SAVE: &str = r#"
import hashlib, os, random, sys
final, size = sys.argv[1], int(sys.argv[2])
os.makedirs(os.path.dirname(final), exist_ok=True)
tmp = final + ".tmp"
rnd, h, left = random.Random(17), hashlib.sha256(), size
with open(tmp, "wb") as f:
    while left:
        b = rnd.randbytes(min(left, (8 << 20) + 4097))
        f.write(b)
        h.update(b)
        left -= len(b)
    f.flush()
    os.fsync(f.fileno())
os.replace(tmp, final)
print(h.hexdigest())
"#;

#[test]
fn a_1gb_checkpoint_saved_to_a_temp_name_and_renamed_reads_back_everywhere_before_and_after_sync() {
    // 1 GB (PAGEFS_CHECKPOINT_MB, default 1024) on two of three nodes: about 700 MB of
    // dirty pages each.
    let _disk = disk_alone();
    let mut mb: usize = std::env::var("PAGEFS_CHECKPOINT_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    // Each node's cache is allocated whole at start: three caches, then the store's copy. A
    // node holds about 2/3 of the checkpoint dirty (two replicas on three nodes) until the
    // file is closed, but the limit is per shard, and a shard's share of the ring may be well
    // above the mean: the dirty limit is twice the mean, the cache 128 MiB more. Where the
    // disk cannot take that the checkpoint shrinks to fit, and says so.
    let dirty_mb = |mb: usize| mb * 4 / 3;
    let need = |mb: usize| (3 * (dirty_mb(mb) + 128) + mb + 256) as u64 * MIB as u64;
    let free = free_bytes(Path::new(
        &std::env::var("PAGESTORE_TEST_DIR").unwrap_or_else(|_| "/var/tmp".into()),
    ));
    while need(mb) > free && mb > 256 {
        mb /= 2;
    }
    if need(mb) > free {
        panic!(
            "{} MiB free for the test's caches and store: a {mb} MiB checkpoint needs {}",
            free >> 20,
            need(mb) >> 20
        );
    }
    eprintln!(
        "checkpoint of {mb} MiB ({} MiB free, {} MiB needed)",
        free >> 20,
        need(mb) >> 20
    );
    let dirty = format!("{}M", dirty_mb(mb));
    let (c, store) = cluster(
        &format!("{}M", dirty_mb(mb) + 128),
        &["--dirty-limit", &dirty],
    );
    let writer = Mount::start(&c, &[]);
    let reader = Mount::start(&c, &[]);
    let size = mb * MIB + 12_345;
    let t = Instant::now();
    let want = python(
        SAVE,
        &[
            writer.path("/ck/run/model.pt").to_str().unwrap(),
            &size.to_string(),
        ],
    );
    let want = want.trim().to_string();
    let took = t.elapsed();
    eprintln!(
        "saved {mb} MiB through pagefs in {took:?} ({:.0} MB/s)",
        size as f64 / took.as_secs_f64() / 1e6
    );
    for m in [&writer, &reader] {
        assert_eq!(
            errno(std::fs::metadata(m.path("/ck/run/model.pt.tmp"))),
            libc::ENOENT,
            "the temporary name is gone"
        );
        assert_eq!(
            std::fs::metadata(m.path("/ck/run/model.pt")).unwrap().len(),
            size as u64
        );
    }

    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(c.client(ClientOptions::default()));
    let read_all = |when: &str| {
        let info = rt.block_on(client.stat("/ck/run/model.pt")).unwrap();
        assert_eq!(info.size, size as u64);
        let mut h = Sha256::new();
        let page = u64::from(client.page_size());
        let mut at = 0;
        while at < info.size {
            let b = rt.block_on(client.read_at(&info, at, 16 * page)).unwrap();
            assert!(!b.is_empty());
            at += b.len() as u64;
            h.update(&b);
        }
        let got: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(got, want, "{when}: through the client library");
        assert_eq!(
            sha256_file(&reader.path("/ck/run/model.pt")),
            want,
            "{when}: through another pagefs mount"
        );
        assert_eq!(
            sha256_pagectl_cat(&c, "/ck/run/model.pt"),
            want,
            "{when}: through pagectl cat"
        );
        info.state
    };
    let before = read_all("before pagectl sync");
    eprintln!("state before pagectl sync: {before:?}");
    assert_ne!(before, FileState::Stored, "written through the cluster");

    let out = c.pagectl(&["sync", "/ck"]);
    assert!(out.status.success(), "pagectl sync: {out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("everything written is in the under storage")
    );
    assert_eq!(read_all("after pagectl sync"), FileState::Clean);
    assert_eq!(
        sha256_file(&store.join("ck/run/model.pt")),
        want,
        "the store"
    );
    assert!(!store.join("ck/run/model.pt.tmp").exists());
}

/// Runs `cmd` (`{src}` replaced by `src`) in `dir`: its exit status.
fn run_in(dir: &Path, cmd: &[&str], src: &Path) -> std::process::ExitStatus {
    let args: Vec<String> = cmd
        .iter()
        .map(|a| a.replace("{src}", src.to_str().unwrap()))
        .collect();
    Command::new(&args[0])
        .args(&args[1..])
        .current_dir(dir)
        .stderr(Stdio::null())
        .status()
        .unwrap()
}

/// Every file and directory under `root`: relative path, and the SHA-256 of a file ("dir" for
/// a directory).
fn tree(root: &Path, dirs: bool) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if p.is_dir() {
                if dirs {
                    out.push((rel, "dir".to_string()));
                }
                todo.push(p);
            } else {
                out.push((rel, sha256_file(&p)));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn coreutils_on_a_write_back_mount_do_what_they_do_on_a_local_disk() {
    let _disk = disk_shared();
    let (c, store) = cluster("512M", &[]);
    let m = Mount::start(&c, &[]);
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("src.bin");
    std::fs::write(&src, bytes(1, 3 * MIB + 333)).unwrap();
    // A time to the nanosecond, which `cp -p` copies.
    let src_time = std::time::UNIX_EPOCH + std::time::Duration::new(1_500_000_000, 123_456_789);
    std::fs::File::options()
        .write(true)
        .open(&src)
        .unwrap()
        .set_modified(src_time)
        .unwrap();
    // An archive of small files with their own times, which tar sets as it extracts them.
    let tarred = local.path().join("tarred");
    std::fs::create_dir(&tarred).unwrap();
    for i in 0..12u64 {
        let f = tarred.join(format!("t{i}"));
        std::fs::write(&f, bytes(20 + i, 1000 + i as usize)).unwrap();
        let at = std::time::UNIX_EPOCH + std::time::Duration::new(1_100_000_000 + i * 3600, 0);
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(at)
            .unwrap();
    }
    let archive = format!("{}.tar", src.display());
    let made = Command::new("tar")
        .args(["-cf", &archive, "-C"])
        .arg(local.path())
        .arg("tarred")
        .status()
        .unwrap();
    assert!(made.success());
    let disk = local.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    let mounted = m.path("/ck/cu");
    std::fs::create_dir(&mounted).unwrap();
    let cmds: &[&[&str]] = &[
        &["mkdir", "-p", "a/b/c"],
        &["cp", "{src}", "f1"],
        &[
            "dd",
            "if={src}",
            "of=f2",
            "bs=64K",
            "seek=7",
            "count=20",
            "conv=notrunc",
            "status=none",
        ],
        &[
            "dd",
            "if={src}",
            "of=f1",
            "bs=4K",
            "seek=100",
            "count=3",
            "conv=notrunc",
            "status=none",
        ],
        &[
            "dd",
            "if={src}",
            "of=f3",
            "bs=1M",
            "seek=2",
            "count=1",
            "status=none",
        ],
        &[
            "dd",
            "if={src}",
            "of=f1",
            "bs=1000",
            "skip=5",
            "seek=2000",
            "count=5",
            "status=none",
        ],
        &["truncate", "-s", "5000", "f2"],
        &["truncate", "-s", "3M", "f4"],
        &["truncate", "-s", "+100", "f3"],
        &["cp", "f1", "a/b/g1"],
        &["mv", "f3", "a/f3moved"],
        &["mv", "f2", "a/f1"],
        &["mv", "a/b", "bmoved"],
        &["rm", "f4"],
        &["rm", "nothing-here"],
        &["rmdir", "bmoved"],
        &["rmdir", "bmoved/c"],
        &["mkdir", "bmoved"],
        &["cp", "-r", "a", "acopy"],
        &["rm", "-r", "a"],
        &["sh", "-c", "echo hello > h.txt && echo more >> h.txt"],
        &["sh", "-c", "cat bmoved/g1 > g1cat && cmp g1cat bmoved/g1"],
        // Times: futimens on the open copy (cp -p), utimensat on closed files (touch -d).
        &["cp", "-p", "{src}", "fp"],
        &["touch", "-d", "@1400000000.5", "h.txt"],
        &["touch", "-m", "-d", "@1300000000.25", "bmoved/g1"],
        &["touch", "-d", "@1200000000", "nothing-here-either"],
        &["tar", "-xf", "{src}.tar"],
        // utimensat by path just after close(2), while the mount may still be closing the file
        // (as rsync sets a temporary file's time before its rename).
        &["python3", "-c", UTIME_AFTER_CLOSE],
        &["mkdir", "empty"],
        // A directory's time (tar above set `tarred`'s from the archive).
        &["touch", "-d", "@1450000000.75", "empty"],
        &["mkdir", "empty2"],
        &["rmdir", "empty2"],
        // A directory's time moves when an entry is made, renamed or removed in it.
        &["sh", "-c", DIR_TIME_MOVES],
    ];
    for cmd in cmds {
        let on_disk = run_in(&disk, cmd, &src);
        let on_mount = run_in(&mounted, cmd, &src);
        assert_eq!(on_mount.code(), on_disk.code(), "{cmd:?}");
    }
    assert_eq!(tree(&mounted, true), tree(&disk, true));
    let mut timed: Vec<String> = [
        "fp",
        "h.txt",
        "bmoved/g1",
        "nothing-here-either",
        "empty",
        "tarred",
    ]
    .map(String::from)
    .to_vec();
    timed.extend((0..12).map(|i| format!("tarred/t{i}")));
    timed.extend((0..12).map(|i| format!("py{i}")));
    let times = |root: &Path| -> Vec<std::time::SystemTime> {
        timed
            .iter()
            .map(|f| std::fs::metadata(root.join(f)).unwrap().modified().unwrap())
            .collect()
    };
    let want = times(&disk);
    assert_eq!(want[0], src_time);
    assert_eq!(times(&mounted), want, "{timed:?}");
    // And the store gets the same files (object stores keep no empty directories).
    let out = c.pagectl(&["sync", "/ck"]);
    assert!(out.status.success(), "pagectl sync: {out:?}");
    assert_eq!(tree(&store.join("ck/cu"), false), tree(&disk, false));
    // The times are the cluster's, flushed or not: another mount sees them too.
    let other = Mount::start(&c, &[]);
    assert_eq!(
        times(&other.path("/ck/cu")),
        want,
        "{timed:?} after the flush"
    );
}

/// Sets a directory's time back, changes an entry in it and checks that its time moved, for a
/// create, a rename, a removal and a mkdir (exit status 0 when every one moved it).
const DIR_TIME_MOVES: &str = "mkdir moving && \
    back() { touch -d @1450000000 moving; }; moved() { test $(stat -c %Y moving) -gt 1450000000; } && \
    back && touch moving/f && moved && back && mv moving/f moving/g && moved && \
    back && rm moving/g && moved && back && mkdir moving/d && moved";

/// Writes files and sets each one's time by path as soon as it is closed.
const UTIME_AFTER_CLOSE: &str = r#"
import os
for i in range(12):
    with open(f"py{i}", "wb") as f:
        f.write(bytes([i]) * (4096 * i + 1))
    t = 1_000_000_000_000_000_000 + i * 1_234_567_891
    os.utime(f"py{i}", ns=(t, t))
"#;

/// Random writes, overwrites past the end, truncations and reads on a read-write handle,
/// done alike on the mount and on a local file; fails if a read differs.
const RANDOM: &str = r#"
import os, random, sys
mounted, local = sys.argv[1], sys.argv[2]
rnd = random.Random(5)
with open(mounted, "w+b") as f, open(local, "w+b") as g:
    for i in range(400):
        op = rnd.random()
        if op < 0.75:
            off = rnd.randrange(0, 5 << 20)
            b = rnd.randbytes(rnd.choice([1, 7, 4096, 65536, 1 << 20, rnd.randrange(1, 3 << 20)]))
            for h in (f, g):
                h.seek(off)
                h.write(b)
        elif op < 0.8:
            n = rnd.randrange(0, 6 << 20)
            for h in (f, g):
                h.truncate(n)
        else:
            off, n = rnd.randrange(0, 6 << 20), rnd.randrange(1, 2 << 20)
            f.seek(off)
            g.seek(off)
            a, b = f.read(n), g.read(n)
            if a != b:
                sys.exit(f"read {i}: {n} bytes at {off} differ ({len(a)} vs {len(b)})")
        if i % 100 == 0:
            f.flush()
            g.flush()
            os.fsync(f.fileno())
            if os.fstat(f.fileno()).st_size != os.fstat(g.fileno()).st_size:
                sys.exit(f"step {i}: size {os.fstat(f.fileno()).st_size} vs {os.fstat(g.fileno()).st_size}")
print(os.path.getsize(local))
"#;

/// errno of the calls in the script (one line each: name, errno name or "ok").
const ERRNOS: &str = r#"
import ctypes, errno, os, sys
ck, data, root = sys.argv[1], sys.argv[2], sys.argv[3]
libc = ctypes.CDLL(None, use_errno=True)
def e(f, *a):
    try:
        f(*a)
        return "ok"
    except OSError as x:
        return errno.errorcode[x.errno]
def noreplace(a, b):
    if libc.renameat2(-100, a.encode(), -100, b.encode(), 1) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")
os.makedirs(f"{ck}/d/sub")
open(f"{ck}/d/f", "w").close()
open(f"{ck}/g", "w").close()
print("mkdir-existing", e(os.mkdir, f"{ck}/d"))
print("rmdir-not-empty", e(os.rmdir, f"{ck}/d"))
print("rmdir-file", e(os.rmdir, f"{ck}/g"))
print("unlink-dir", e(os.unlink, f"{ck}/d/sub"))
print("create-excl", e(os.open, f"{ck}/g", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
print("rename-noreplace", e(noreplace, f"{ck}/d/f", f"{ck}/g"))
print("rename-over-dir", e(os.rename, f"{ck}/g", f"{ck}/d"))
print("rename-dir", e(os.rename, f"{ck}/d", f"{ck}/d2"))
print("rename-across-mounts", e(os.rename, f"{ck}/g", f"{data}/g"))
print("create-outside-mounts", e(open, f"{root}/new", "w"))
print("mkdir-outside-mounts", e(os.mkdir, f"{root}/newdir"))
print("open-missing", e(open, f"{ck}/missing/x", "w"))
long = "n" * 256
print("create-long-name", e(open, f"{ck}/{long}", "w"))
print("create-long-name-through", e(open, f"{data}/{long}", "w"))
print("mkdir-long-name", e(os.mkdir, f"{ck}/{long}"))
print("rename-to-long-name", e(os.rename, f"{ck}/g", f"{ck}/{long}"))
print("stat-long-name", e(os.stat, f"{data}/{long}"))
print("create-255", e(open, f"{ck}/{'n' * 255}", "w"))
"#;

#[test]
fn errnos_random_writes_close_to_open_and_write_through() {
    let _disk = disk_shared();
    let (c, store) = cluster("512M", &[]);
    let a = Mount::start(&c, &[]);
    let b = Mount::start(&c, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(c.client(ClientOptions::default()));

    // errno as POSIX says.
    let out = python(
        ERRNOS,
        &[
            a.path("/ck").to_str().unwrap(),
            a.path("/data").to_str().unwrap(),
            a.mp.to_str().unwrap(),
        ],
    );
    let got: Vec<(&str, &str)> = out.lines().map(|l| l.split_once(' ').unwrap()).collect();
    assert_eq!(
        got,
        [
            ("mkdir-existing", "EEXIST"),
            ("rmdir-not-empty", "ENOTEMPTY"),
            ("rmdir-file", "ENOTDIR"),
            ("unlink-dir", "EISDIR"),
            ("create-excl", "EEXIST"),
            ("rename-noreplace", "EEXIST"),
            ("rename-over-dir", "EISDIR"),
            ("rename-dir", "EXDEV"),
            ("rename-across-mounts", "EXDEV"),
            ("create-outside-mounts", "EROFS"),
            ("mkdir-outside-mounts", "EROFS"),
            ("open-missing", "ENOENT"),
            ("create-long-name", "ENAMETOOLONG"),
            ("create-long-name-through", "ENAMETOOLONG"),
            ("mkdir-long-name", "ENAMETOOLONG"),
            ("rename-to-long-name", "ENAMETOOLONG"),
            ("stat-long-name", "ENOENT"),
            ("create-255", "ok"),
        ]
    );

    // Random writes equal a local reference, on the mount, for another mount, in the store.
    let local = tempfile::tempdir().unwrap();
    let reference = local.path().join("ref");
    let size: u64 = python(
        RANDOM,
        &[
            a.path("/ck/rand.bin").to_str().unwrap(),
            reference.to_str().unwrap(),
        ],
    )
    .trim()
    .parse()
    .unwrap();
    let want = std::fs::read(&reference).unwrap();
    assert_eq!(want.len() as u64, size);
    assert!(std::fs::read(a.path("/ck/rand.bin")).unwrap() == want);
    assert!(std::fs::read(b.path("/ck/rand.bin")).unwrap() == want);
    let out = c.pagectl(&["sync", "/ck/rand.bin"]);
    assert!(out.status.success(), "{out:?}");
    assert!(std::fs::read(store.join("ck/rand.bin")).unwrap() == want);

    // Close-to-open: another mount sees what a writer fsynced (the file still open, so not
    // flushed: only the cluster has it), then what it closed.
    use std::io::Write;
    let one = bytes(7, 2 * MIB + 5);
    let two = bytes(8, MIB + 11);
    let mut f = std::fs::File::create(a.path("/ck/live.bin")).unwrap();
    f.write_all(&one).unwrap();
    f.sync_all().unwrap();
    assert!(std::fs::read(b.path("/ck/live.bin")).unwrap() == one);
    let info = rt.block_on(client.stat("/ck/live.bin")).unwrap();
    assert_eq!(
        (info.size, info.state),
        (one.len() as u64, FileState::Writing)
    );
    assert!(
        !store.join("ck/live.bin").exists(),
        "not flushed while open"
    );
    // The writer sees its own size at once (no attribute cache in the way).
    f.write_all(&two).unwrap();
    let whole = [one.clone(), two.clone()].concat();
    assert_eq!(
        std::fs::metadata(a.path("/ck/live.bin")).unwrap().len(),
        whole.len() as u64
    );
    drop(f);
    assert!(std::fs::read(b.path("/ck/live.bin")).unwrap() == whole);
    assert!(
        rt.block_on(client.read("/ck/live.bin", 0..u64::MAX))
            .unwrap()
            == whole
    );

    // write=through: staged here, in the store at close (one request, and in parts above
    // 16 MiB), for the client and another mount too; a rename is a copy and a delete there.
    std::fs::create_dir_all(a.path("/data/in/deep")).unwrap();
    for (name, n) in [("small.bin", 1000), ("large.bin", 20 * MIB + 3)] {
        let content = bytes(n as u64, n);
        std::fs::write(a.path(&format!("/data/in/deep/{name}")), &content).unwrap();
        assert!(std::fs::read(store.join(format!("data/in/deep/{name}"))).unwrap() == content);
        assert!(std::fs::read(b.path(&format!("/data/in/deep/{name}"))).unwrap() == content);
        let got = rt
            .block_on(client.read(&format!("/data/in/deep/{name}"), 0..u64::MAX))
            .unwrap();
        assert!(got == content);
    }
    std::fs::rename(
        a.path("/data/in/deep/small.bin"),
        a.path("/data/in/moved.bin"),
    )
    .unwrap();
    assert!(!store.join("data/in/deep/small.bin").exists());
    assert_eq!(
        std::fs::read(store.join("data/in/moved.bin"))
            .unwrap()
            .len(),
        1000
    );
    std::fs::remove_file(a.path("/data/in/moved.bin")).unwrap();
    assert!(!store.join("data/in/moved.bin").exists());
    assert!(matches!(
        rt.block_on(client.stat("/data/in/moved.bin")),
        Err(Error::NotFound(_))
    ));
    // An fsync error-free append, and O_APPEND from two opens.
    for s in ["one ", "two"] {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(a.path("/data/log.txt"))
            .unwrap();
        f.write_all(s.as_bytes()).unwrap();
        f.sync_all().unwrap();
    }
    assert_eq!(
        std::fs::read(store.join("data/log.txt")).unwrap(),
        b"one two"
    );
}

#[test]
fn read_only_mounts_and_stores_without_credentials_stay_read_only() {
    let _disk = disk_shared();
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("bucket")).unwrap();
    std::fs::write(root.path().join("bucket/obj"), b"in s3").unwrap();
    let s3 =
        pagestore_testkit::S3Server::start(root.path(), "AKIDPAGEFS", "pagefs-secret").unwrap();
    let (dir, mut s) = common::settings();
    let ck = dir.path().join("store/ck");
    std::fs::create_dir_all(&ck).unwrap();
    std::fs::write(ck.join("old.txt"), b"old").unwrap();
    s.mounts = vec![
        format!("/ck=file://{}?write=back", ck.display()),
        format!(
            "/s3=s3://bucket?endpoint={}&region=us-east-1&access_key_id=AKIDPAGEFS&secret_access_key=pagefs-secret",
            s3.endpoint()
        ),
    ];
    let c = Cluster::start(dir, s);

    // --read-only: every write is EROFS, the mount is ro, reads work.
    let ro = Mount::start(&c, &["--read-only"]);
    let line = std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(ro.mp.to_str().unwrap()))
        .unwrap()
        .to_string();
    assert!(line.contains(" ro,"), "{line}");
    assert_eq!(std::fs::read(ro.path("/ck/old.txt")).unwrap(), b"old");
    assert_eq!(
        errno(std::fs::File::create(ro.path("/ck/new"))),
        libc::EROFS
    );
    assert_eq!(errno(std::fs::create_dir(ro.path("/ck/d"))), libc::EROFS);
    assert_eq!(
        errno(std::fs::remove_file(ro.path("/ck/old.txt"))),
        libc::EROFS
    );
    let md = std::fs::metadata(ro.path("/ck/old.txt")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(md.permissions().mode() & 0o222, 0, "no write bits shown");

    // The S3 mount's credentials stay on the nodes: this machine cannot write it (EROFS), and
    // reads it through the cluster; the write=back mount takes writes.
    let m = Mount::start(&c, &[]);
    assert_eq!(std::fs::read(m.path("/s3/obj")).unwrap(), b"in s3");
    assert_eq!(errno(std::fs::File::create(m.path("/s3/new"))), libc::EROFS);
    assert_eq!(
        errno(
            std::fs::OpenOptions::new()
                .write(true)
                .open(m.path("/s3/obj"))
        ),
        libc::EROFS
    );
    assert_eq!(errno(std::fs::remove_file(m.path("/s3/obj"))), libc::EROFS);
    assert_eq!(errno(std::fs::create_dir(m.path("/s3/d"))), libc::EROFS);
    assert_eq!(
        errno(std::fs::rename(m.path("/s3/obj"), m.path("/s3/obj2"))),
        libc::EROFS
    );
    let md = std::fs::metadata(m.path("/s3/obj")).unwrap();
    assert_eq!(md.permissions().mode() & 0o777, 0o444);
    std::fs::write(m.path("/ck/new.txt"), b"new").unwrap();
    assert_eq!(std::fs::read(ro.path("/ck/new.txt")).unwrap(), b"new");
    assert_eq!(
        std::fs::read(root.path().join("bucket/obj")).unwrap(),
        b"in s3"
    );
}

/// Runs fio with `args`; panics with its output unless it succeeds.
fn fio(args: &[&str]) {
    // No verify state files left in the working directory.
    let out = Command::new("fio")
        .args(["--minimal", "--verify_state_save=0"])
        .args(args)
        .output()
        .expect("fio (apt install fio)");
    assert!(
        out.status.success(),
        "fio {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// fio, as a storage tester runs it: a file fio wrote in the store (with its verify headers)
/// reads back byte-exact through the mount with every I/O engine, buffered and O_DIRECT, in
/// large and 4 KiB blocks; random writes, sequential writes and mixed reads and writes with
/// fsyncs on a write-back mount read back as fio wrote them (fio's own verify), and the store
/// holds the same bytes after `pagectl sync`.
#[test]
fn fio_reads_and_verified_writes_through_the_mount() {
    let _disk = disk_shared();
    let (c, store) = cluster("512M", &[]);
    let m = Mount::start(&c, &[]);
    let src = store.join("data/fio.bin");
    // Files of 24 pages: a writer keeps 8 in memory, random writes leave the others in its
    // spill file until the fsync or close.
    let job = |file: &Path, extra: &[&str]| -> Vec<String> {
        let mut v = vec![
            "--name=pagefs".to_string(),
            format!("--filename={}", file.display()),
            "--size=24M".into(),
            "--verify=crc32c".into(),
        ];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let run = |args: Vec<String>| fio(&args.iter().map(String::as_str).collect::<Vec<_>>());
    // Written in the store directly, then read through the mount, each block checked against
    // the header fio wrote in it.
    run(job(&src, &["--rw=write", "--bs=64k"]));
    for engine in ["psync", "libaio", "io_uring"] {
        for direct in ["0", "1"] {
            for rw in ["--rw=read", "--rw=randread"] {
                run(job(
                    &m.path("/data/fio.bin"),
                    &[
                        rw,
                        "--readonly",
                        "--bs=64k",
                        "--iodepth=8",
                        &format!("--ioengine={engine}"),
                        &format!("--direct={direct}"),
                    ],
                ));
            }
        }
    }
    // 4 KiB random reads and 1 MiB sequential ones (fio fails on a short or failed read),
    // then the whole file compared.
    for (rw, bs) in [("randread", "4k"), ("read", "1M")] {
        run(vec![
            "--name=plain".into(),
            format!("--filename={}", m.path("/data/fio.bin").display()),
            format!("--rw={rw}"),
            format!("--bs={bs}"),
            "--size=24M".into(),
            "--io_size=4M".into(),
            "--readonly".into(),
            "--ioengine=io_uring".into(),
            "--iodepth=16".into(),
            "--direct=1".into(),
        ]);
    }
    assert_eq!(sha256_file(&m.path("/data/fio.bin")), sha256_file(&src));

    // Writes on the write-back mount, verified by fio reading them back through the mount.
    for direct in ["0", "1"] {
        let f = m.path(&format!("/ck/fio/seq{direct}"));
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        run(job(
            &f,
            &["--rw=write", "--bs=1M", &format!("--direct={direct}")],
        ));
        let f = m.path(&format!("/ck/fio/rand{direct}"));
        run(job(
            &f,
            &[
                "--rw=randwrite",
                "--bs=4k",
                "--ioengine=libaio",
                "--iodepth=8",
                &format!("--direct={direct}"),
            ],
        ));
        let f = m.path(&format!("/ck/fio/mixed{direct}"));
        run(job(
            &f,
            &[
                "--rw=randrw",
                "--bs=64k",
                "--ioengine=io_uring",
                "--iodepth=4",
                "--fsync=16",
                &format!("--direct={direct}"),
            ],
        ));
    }
    let out = c.pagectl(&["sync", "/ck"]);
    assert!(out.status.success(), "pagectl sync: {out:?}");
    for name in ["seq0", "rand0", "mixed0", "seq1", "rand1", "mixed1"] {
        let mounted = m.path(&format!("/ck/fio/{name}"));
        assert_eq!(
            std::fs::metadata(&mounted).unwrap().len(),
            24 << 20,
            "{name}"
        );
        assert_eq!(
            sha256_file(&store.join(format!("ck/fio/{name}"))),
            sha256_file(&mounted),
            "{name}: the store after pagectl sync"
        );
    }
}

/// Two versions of one path open at once through one mount (a reader of the file that a
/// rename replaced, and a reader of the new one) are each read whole and unmixed. Both are
/// the path's inode to the kernel, whose cache and size of it served either: each reader got
/// some of the other version's pages (and a reader stopped at, or read on to, the other
/// version's size).
#[test]
fn two_versions_of_a_file_open_at_once_are_each_read_whole() {
    let _disk = disk_shared();
    let (c, _store) = cluster("512M", &[]);
    let m = Mount::start(&c, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(c.client(ClientOptions::default()));
    let page = client.page_size() as usize;
    // Of different sizes: the kernel keeps one size per inode too.
    let (old, new) = (bytes(81, 3 * page + 500), bytes(82, 2 * page + 100));
    rt.block_on(client.write_file("/ck/v/latest.pt", old.clone().into()))
        .unwrap();
    let path = m.path("/ck/v/latest.pt");
    let mut a = std::fs::File::open(&path).unwrap();
    rt.block_on(client.write_file("/ck/v/.latest.pt.tmp", new.clone().into()))
        .unwrap();
    rt.block_on(client.rename("/ck/v/.latest.pt.tmp", "/ck/v/latest.pt", true))
        .unwrap();
    let mut b = std::fs::File::open(&path).unwrap();
    // The new version's reader reads its first half, the old one's reader all of it, then
    // the new one's the rest.
    let half = new.len() / 2;
    let mut got_b = vec![0u8; new.len()];
    b.read_exact(&mut got_b[..half]).unwrap();
    let mut got_a = Vec::new();
    a.read_to_end(&mut got_a).unwrap();
    b.read_exact(&mut got_b[half..]).unwrap();
    let mut past = Vec::new();
    b.read_to_end(&mut past).unwrap();
    assert_eq!(past.len(), 0, "the new version's reader read past its end");
    assert!(
        got_a == old,
        "the replaced version's reader got other bytes"
    );
    assert!(got_b == new, "the new version's reader got other bytes");
    // Once both are closed, an open reads the new version whole (nothing of the old one
    // stays cached for it).
    drop((a, b));
    let whole = std::fs::read(&path).unwrap();
    assert!(
        whole == new,
        "after both closed: {} bytes read, the new version has {} (the old {}); first \
         difference at {:?}",
        whole.len(),
        new.len(),
        old.len(),
        whole.iter().zip(&new).position(|(x, y)| x != y)
    );
    let mut again = std::fs::File::open(&path).unwrap();
    let mut got = Vec::new();
    again.read_to_end(&mut got).unwrap();
    assert!(got == new);
}
