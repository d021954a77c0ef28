//! `pagefs` mounted for real (FUSE, as root) over three `pagestored` processes: every file read
//! through the mount is byte-exact, eight processes reading random ranges at once get exact
//! bytes, a 10,000-entry directory lists whole, errors map to the right errno, a stopped worker
//! stalls only the reads that need it, a killed worker costs speed but not bytes, SIGTERM
//! unmounts, files show the store's modification times (as the client and the S3 gateway do), a
//! directory emptied on the store disappears (so `cp -r` copies what is there), and `df` shows
//! the cluster's cache.
//!
//! Needs root and /dev/fuse (as in CI). Every mount is undone by a drop guard, so a failing
//! test leaves no mount behind.
#![allow(clippy::unwrap_used)]

use pagestore_testkit::fixture as common;

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    os::unix::fs::{FileExt, PermissionsExt},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::{bytes, Cluster};
use pagestore_client::ClientOptions;
use pagestore_testkit::sha256_hex;

const PAGEFS: &str = env!("CARGO_BIN_EXE_pagefs");
const MIB: usize = 1 << 20;

mod mount;
use mount::{kill, mounted, Mount};

/// A cluster over a data directory holding `files` (logical paths under `/data`).
fn cluster_with(files: &BTreeMap<String, Vec<u8>>) -> Cluster {
    let (dir, mut s) = common::settings();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    for (p, b) in files {
        let path = data.join(p.trim_start_matches("/data/"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b).unwrap();
    }
    s.mounts = vec![format!("/data=file://{}", data.display())];
    Cluster::start(dir, s)
}

fn errno<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.unwrap_err().raw_os_error().unwrap()
}

/// `len` bytes at `off` of `path` through `dd` (a separate process, as a data loader's worker).
fn dd(path: &Path, off: usize, len: usize) -> Vec<u8> {
    let out = Command::new("dd")
        .arg(format!("if={}", path.display()))
        .args([
            "bs=1M",
            "iflag=skip_bytes,count_bytes,fullblock",
            "status=none",
        ])
        .arg(format!("skip={off}"))
        .arg(format!("count={len}"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    out.stdout
}

fn lcg(x: &mut u64) -> u64 {
    *x = x
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *x >> 33
}

#[test]
fn a_mount_is_byte_exact_lists_10000_entries_and_maps_errors_like_posix() {
    let ps = MIB;
    let mut files = BTreeMap::new();
    for (i, n) in [0, 1, ps - 1, ps, ps + 1, 5 * ps + 3]
        .into_iter()
        .enumerate()
    {
        let dir = ["a", "a/b", "a/b/c"][i % 3];
        files.insert(format!("/data/{dir}/f{i}"), bytes(i as u64 + 1, n));
    }
    let v1 = bytes(50, 3 * ps / 2);
    files.insert("/data/rw/obj".into(), v1.clone());
    let big = bytes(99, 24 * ps + 777);
    files.insert("/data/rand/big".into(), big.clone());
    let many: Vec<String> = (0..10_000).map(|i| format!("entry-{i:05}")).collect();
    for (i, name) in many.iter().enumerate() {
        files.insert(format!("/data/many/{name}"), format!("{i}\n").into_bytes());
    }
    let c = cluster_with(&files);
    // Read-only, as before writes existed (the file:// mount's directory is on this machine,
    // so without --read-only its paths would take writes).
    let m = Mount::start(&c, &["--read-only"]);
    let opts = std::fs::read_to_string("/proc/mounts").unwrap();
    let line = opts
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(m.mp.to_str().unwrap()))
        .unwrap();
    assert!(line.contains(" ro,"), "{line}");

    // Eight processes read random ranges of a cold file at once: page boundaries, the tail,
    // past the end.
    let big_path = m.path("/data/rand/big");
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (big, big_path) = (&big, &big_path);
            s.spawn(move || {
                let mut x = t + 1;
                for r in 0..8 {
                    let (off, len) = match r {
                        0 => ((t as usize + 1) * ps - 100, 200),
                        1 => (big.len() - 10, 100),
                        2 => (big.len() + 5, 10),
                        _ => (
                            lcg(&mut x) as usize % big.len(),
                            1 + lcg(&mut x) as usize % (3 * ps),
                        ),
                    };
                    let got = dd(big_path, off, len);
                    let want = &big[off.min(big.len())..(off + len).min(big.len())];
                    assert!(got == want, "process {t}: {len} bytes at {off} differ");
                }
            });
        }
    });

    // Every file, whole, through std::fs: sizes, modes, sha256.
    for (p, b) in files.iter().filter(|(p, _)| !p.starts_with("/data/many/")) {
        let path = m.path(p);
        let meta = std::fs::metadata(&path).unwrap();
        assert!(meta.is_file(), "{p}");
        assert_eq!(meta.len(), b.len() as u64, "{p}");
        assert_eq!(meta.permissions().mode() & 0o7777, 0o444, "{p}");
        assert_eq!(
            sha256_hex(&std::fs::read(&path).unwrap()),
            sha256_hex(b),
            "{p} read through the mount differs from the source"
        );
    }
    let dir_meta = std::fs::metadata(m.path("/data/a/b")).unwrap();
    assert!(dir_meta.is_dir());
    assert_eq!(dir_meta.permissions().mode() & 0o7777, 0o555);
    let names = |p: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(m.path(p))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names("/"), ["data"]);
    assert_eq!(names("/data"), ["a", "many", "rand", "rw"]);
    assert_eq!(names("/data/a/b"), ["c", "f1", "f4"]);

    // 10,000 entries over many readdir calls, each once, then read back by name.
    let t = Instant::now();
    let listed = names("/data/many");
    let list_time = t.elapsed();
    assert_eq!(listed.len(), 10_000);
    assert!(listed == many, "the listing differs from the directory");
    for i in [0, 1, 4_999, 9_999] {
        let got = std::fs::read(m.path(&format!("/data/many/{}", many[i]))).unwrap();
        assert_eq!(got, format!("{i}\n").into_bytes());
    }
    eprintln!("listed 10,000 entries through FUSE in {list_time:?}");

    // Errors, as POSIX says.
    let e = std::fs::metadata(m.path("/data/nope")).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    assert_eq!(errno(std::fs::read(m.path("/data/a/nope"))), libc::ENOENT);
    assert_eq!(
        errno(std::fs::read_dir(m.path("/data/a/f0"))),
        libc::ENOTDIR
    );
    assert_eq!(
        errno(std::fs::metadata(m.path("/data/a/f0/x"))),
        libc::ENOTDIR
    );
    assert_eq!(errno(std::fs::read(m.path("/data/a"))), libc::EISDIR);
    // Read-only.
    assert_eq!(
        errno(std::fs::File::create(m.path("/data/new"))),
        libc::EROFS
    );
    assert_eq!(
        errno(
            std::fs::OpenOptions::new()
                .write(true)
                .open(m.path("/data/a/f0"))
        ),
        libc::EROFS
    );
    assert_eq!(errno(std::fs::create_dir(m.path("/data/d"))), libc::EROFS);
    assert_eq!(
        errno(std::fs::remove_file(m.path("/data/a/f0"))),
        libc::EROFS
    );

    // Short reads at the end, empty ones past it.
    let (p, content) = files.iter().find(|(_, b)| b.len() == ps + 1).unwrap();
    let f = std::fs::File::open(m.path(p)).unwrap();
    let mut buf = vec![0u8; 100];
    let size = content.len() as u64;
    assert_eq!(f.read_at(&mut buf, size - 3).unwrap(), 3);
    assert_eq!(&buf[..3], &content[content.len() - 3..]);
    assert_eq!(f.read_at(&mut buf, size).unwrap(), 0);
    assert_eq!(f.read_at(&mut buf, size + 4096).unwrap(), 0);
    drop(f);

    // An object rewritten in the under storage, larger: once the nodes' metadata expires (1 s)
    // a new open reads the new version whole, although the kernel cached the old size (and
    // pages) for the 10 s attribute TTL.
    let obj = m.path("/data/rw/obj");
    assert!(std::fs::read(&obj).unwrap() == v1);
    let v2 = bytes(51, 5 * ps / 2 + 9);
    std::fs::write(c.dir.path().join("data/rw/obj"), &v2).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let got = std::fs::read(&obj).unwrap();
    assert_eq!(got.len(), v2.len(), "the new version's size");
    assert!(got == v2, "the new version's bytes, none of the old");

    // SIGTERM unmounts and exits 0.
    let mp = m.mp.clone();
    let (status, out) = m.terminate();
    assert!(status.success(), "pagefs exits 0 on SIGTERM: {status:?}");
    assert!(!mounted(&mp), "the mount is gone");
    assert!(out.iter().any(|l| l.starts_with("unmounted")), "{out:?}");
}

#[test]
fn a_stopped_worker_is_left_when_it_goes_silent_and_a_killed_one_costs_no_bytes() {
    // Single-page files: for each we know which nodes serve its metadata and its page.
    let mut files = BTreeMap::new();
    for i in 0..40 {
        files.insert(
            format!("/data/s/f{i:02}"),
            bytes(1000 + i, 600_000 + i as usize),
        );
    }
    files.insert("/data/long".into(), bytes(7, 9 * MIB + 5));
    let mut c = cluster_with(&files);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(c.client(ClientOptions::default()));
    let membership = client.membership();
    let ring = membership.ring();
    let nodes_of = |p: &str| -> Vec<usize> {
        let info = rt.block_on(client.stat(p)).unwrap();
        let meta = ring
            .owner_of_hash(pagestore_protocol::ring::path_hash(p))
            .unwrap();
        let page = ring.owner(info.file_id, 0).unwrap();
        [meta, page]
            .iter()
            .map(|m| c.node_of(client.membership().addr_of(*m).unwrap()))
            .collect()
    };
    let small: Vec<&String> = files.keys().filter(|p| p.starts_with("/data/s/")).collect();
    let slow = *small.iter().find(|p| nodes_of(p)[1] == 1).unwrap();
    let quick = *small.iter().find(|p| !nodes_of(p).contains(&1)).unwrap();

    // A call timeout far above what the silence rule needs, so that a read that completes well
    // before it was given up on by that rule (even on a loaded machine).
    let m = Mount::start(&c, &["--timeout", "30"]);
    // Names are known (and cached) before the worker stops.
    assert_eq!(std::fs::read_dir(m.path("/data/s")).unwrap().count(), 40);

    assert_eq!(
        kill(c.nodes[1].child.as_ref().unwrap().id(), libc::SIGSTOP),
        0
    );
    let slow_path = m.path(slow);
    let t0 = Instant::now();
    let stalled = std::thread::spawn(move || {
        let b = std::fs::read(slow_path).unwrap();
        (b, t0.elapsed())
    });
    std::thread::sleep(Duration::from_millis(50));
    // Another reader is not held up by the stalled one.
    let t1 = Instant::now();
    let got = std::fs::read(m.path(quick)).unwrap();
    let quick_time = t1.elapsed();
    assert!(got == files[quick]);
    assert!(
        quick_time < Duration::from_millis(1000),
        "a read from live workers took {quick_time:?} while another was stalled"
    );
    // The read that needs the stopped worker gives it up once it has been silent (not even
    // answering a ping) for a few times its usual answer time, and reads the under storage:
    // byte-exact, long before the 30 s call timeout (and before the connection idle timeout of
    // 10 s, which a member that never answered this client once had to wait for).
    let (slow_bytes, slow_time) = stalled.join().unwrap();
    assert!(
        slow_bytes == files[slow],
        "the stalled read completes byte-exact"
    );
    assert!(
        slow_time < Duration::from_secs(5),
        "the read that needed the stopped worker took {slow_time:?}"
    );
    eprintln!("stalled read: {slow_time:?}; concurrent read from live workers: {quick_time:?}");

    // Now the worker dies: every file (metadata and pages it owned) still reads byte-exact.
    c.inner.kill(1);
    for (p, b) in &files {
        let got = std::fs::read(m.path(p)).unwrap();
        assert!(got == *b, "{p} differs after a worker died");
    }
    let (status, out) = m.terminate();
    assert!(status.success(), "{status:?}");
    let stats = out
        .iter()
        .find(|l| l.starts_with("unmounted"))
        .unwrap_or_else(|| panic!("{out:?}"));
    let fallbacks: u64 = stats
        .split("fallbacks: ")
        .nth(1)
        .and_then(|s| s.split(|ch: char| !ch.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stats}"));
    assert!(
        fallbacks > 0,
        "reads fell back to the under storage: {stats}"
    );
}

#[test]
fn bad_mount_points_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let run = |mp: &Path| {
        let out = Command::new(PAGEFS)
            .arg(mp)
            .args(["--cluster", "127.0.0.1:9"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        String::from_utf8(out.stderr).unwrap()
    };
    assert!(run(dir.path()).contains("is not empty"));
    assert!(run(&file).contains("is not a directory"));
    assert!(run(&dir.path().join("missing")).contains("create an empty directory"));
    let out = Command::new(PAGEFS).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage: pagefs MOUNTPOINT"));
}

/// `cat PATH` as the unprivileged user `nobody` (uid and gid 65534, no other groups).
fn cat_as_nobody(p: &Path) -> std::process::Output {
    Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            "cat",
        ])
        .arg(p)
        .output()
        .unwrap()
}

#[test]
fn allow_other_lets_other_users_read_only_what_the_file_modes_allow() {
    let mut files = BTreeMap::new();
    files.insert("/data/open.txt".to_string(), b"for everyone".to_vec());
    files.insert("/data/secret.txt".to_string(), b"TOP-SECRET".to_vec());
    files.insert("/data/private/inner.txt".to_string(), b"PRIVATE".to_vec());
    let c = cluster_with(&files);
    let data = c.dir.path().join("data");
    let mode = |p: &str, m: u32| {
        std::fs::set_permissions(data.join(p), std::fs::Permissions::from_mode(m)).unwrap()
    };
    mode("open.txt", 0o644);
    mode("secret.txt", 0o000);
    mode("private", 0o700);
    mode("private/inner.txt", 0o644);
    let m = Mount::start(&c, &["--allow-other", "--attr-ttl", "0"]);
    // Another user reads what the modes allow, and nothing else.
    let out = cat_as_nobody(&m.path("/data/open.txt"));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"for everyone");
    for p in ["/data/secret.txt", "/data/private/inner.txt"] {
        let out = cat_as_nobody(&m.path(p));
        assert!(!out.status.success(), "nobody read {p}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
            "{out:?}"
        );
        assert!(out.stdout.is_empty());
    }
    // The modes and owners shown are the files' own (with their write bits: this machine
    // can write the file:// mount's directory, so its paths take writes).
    let md = std::fs::metadata(m.path("/data/secret.txt")).unwrap();
    assert_eq!(md.permissions().mode() & 0o7777, 0);
    let md = std::fs::metadata(m.path("/data/open.txt")).unwrap();
    assert_eq!(md.permissions().mode() & 0o7777, 0o644);
    // So another user may not write root's file, nor create one in root's directory.
    for p in ["/data/open.txt", "/data/new.txt"] {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args(["sh", "-c", "echo x >> \"$0\""])
            .arg(m.path(p))
            .output()
            .unwrap();
        assert!(!out.status.success(), "nobody wrote {p}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
            "{out:?}"
        );
    }
    assert_eq!(
        std::fs::read(data.join("open.txt")).unwrap(),
        b"for everyone"
    );
    assert!(!data.join("new.txt").exists());
    // Root, who may read the files locally, still can.
    assert_eq!(
        std::fs::read(m.path("/data/secret.txt")).unwrap(),
        b"TOP-SECRET"
    );
}

/// 2020-01-02T03:04:05.123456789Z, a file's modification time in the store.
const OLD_NS: i64 = 1_577_934_245_123_456_789;

/// A whole HTTP/1.1 exchange with the gateway at `addr`: the response head (lower-case header
/// names) and body.
fn http(addr: &str, method: &str, target: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "{method} {target}: {head}"
    );
    (head.to_ascii_lowercase(), body.to_string())
}

/// `pages3 --anonymous` over the cluster; the address it serves, and the process (killed on
/// drop).
struct Gateway(Child, String);

impl Gateway {
    fn start(c: &Cluster) -> Gateway {
        let mut child = Command::new(common::binary("pages3"))
            .args(["--anonymous", "--listen", "127.0.0.1:0", "--cluster"])
            .arg(&c.members)
            .arg("--tls-dir")
            .arg(&c.ca_dir)
            .arg("--staging-dir")
            .arg(c.dir.path().join("pages3-staging"))
            .env("PAGESTORE_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        for line in out.lines() {
            let line = line.unwrap();
            if let Some(url) = line.strip_prefix("ready ") {
                let addr = url.trim().trim_start_matches("http://").to_string();
                return Gateway(child, addr);
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("pages3 exited before it was ready");
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn files_show_the_stores_modification_time_through_the_client_pagefs_and_pages3() {
    use std::os::unix::fs::MetadataExt;
    let mut files = BTreeMap::new();
    files.insert("/data/t/old.bin".to_string(), bytes(3, 3000));
    files.insert("/data/t/new.bin".to_string(), bytes(4, 10));
    let c = cluster_with(&files);
    let old = c.dir.path().join("data/t/old.bin");
    let st = Command::new("touch")
        .args(["-m", "-d", "@1577934245.123456789"])
        .arg(&old)
        .status()
        .unwrap();
    assert!(st.success());
    let want = std::time::UNIX_EPOCH + Duration::from_nanos(OLD_NS as u64);
    assert_eq!(std::fs::metadata(&old).unwrap().modified().unwrap(), want);
    let new_mtime = std::fs::metadata(c.dir.path().join("data/t/new.bin"))
        .unwrap()
        .modified()
        .unwrap();

    // The client: stat and listing agree with the store, to the nanosecond.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(c.client(ClientOptions::default()));
    let info = rt.block_on(client.stat("/data/t/old.bin")).unwrap();
    assert_eq!(info.mtime_ns, OLD_NS);
    assert_eq!(info.modified(), want);
    let listed = rt.block_on(client.list("/data/t")).unwrap();
    let entry = listed.iter().find(|e| e.name == "old.bin").unwrap();
    assert_eq!(
        (entry.size, &entry.version_tag, entry.mtime_ns),
        (3000, &info.version, OLD_NS),
        "the listing carries what stat says: size, version and time"
    );

    // pagefs: mtime and ctime are the object's, whether learned by lookup or by readdir.
    let m = Mount::start(&c, &[]);
    let md = std::fs::metadata(m.path("/data/t/old.bin")).unwrap();
    assert_eq!(md.modified().unwrap(), want);
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_577_934_245, 123_456_789));
    assert_eq!((md.ctime(), md.ctime_nsec()), (1_577_934_245, 123_456_789));
    let names: Vec<_> = std::fs::read_dir(m.path("/data/t"))
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    let new = names.iter().find(|e| e.file_name() == "new.bin").unwrap();
    assert_eq!(new.metadata().unwrap().modified().unwrap(), new_mtime);
    let out = Command::new("stat")
        .args(["-c", "%Y"])
        .arg(m.path("/data/t/old.bin"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1577934245");

    // pages3: Last-Modified of HEAD and GET, and LastModified in listings.
    let gw = Gateway::start(&c);
    for method in ["HEAD", "GET"] {
        let (head, _) = http(&gw.1, method, "/data/t/old.bin");
        assert!(
            head.contains("last-modified: thu, 02 jan 2020 03:04:05 gmt"),
            "{method}: {head}"
        );
    }
    let (_, body) = http(&gw.1, "GET", "/data?list-type=2&prefix=t/");
    assert!(
        body.contains("<Key>t/old.bin</Key>") && body.contains("<LastModified>2020-01-02T03:04:05"),
        "{body}"
    );
}

#[test]
fn an_emptied_directory_disappears_so_cp_r_copies_what_is_there_and_df_shows_the_cache() {
    let mut files = BTreeMap::new();
    for (p, n) in [
        ("/data/tree/keep/a.txt", 100),
        ("/data/tree/gone/b.txt", 200),
        ("/data/tree/gone/deeper/c.txt", 300),
        ("/data/tree/top.txt", 3 * MIB + 5),
    ] {
        files.insert(p.to_string(), bytes(n as u64, n));
    }
    let c = cluster_with(&files);
    let data = c.dir.path().join("data");
    // A directory with nothing in it, and one with only an empty directory in it.
    std::fs::create_dir_all(data.join("tree/empty")).unwrap();
    std::fs::create_dir_all(data.join("tree/hollow/inner")).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(c.client(ClientOptions::default()));
    let listed = |p: &str| -> Vec<String> {
        rt.block_on(client.list(p))
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect()
    };
    let m = Mount::start(&c, &["--attr-ttl", "0"]);
    let names = |p: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(m.path(p))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(listed("/data/tree"), ["gone", "keep", "top.txt"]);
    assert_eq!(names("/data/tree"), ["gone", "keep", "top.txt"]);
    for p in ["/data/tree/empty", "/data/tree/hollow"] {
        assert!(matches!(
            rt.block_on(client.stat_path(p)),
            Err(pagestore_client::Error::NotFound(_))
        ));
        assert_eq!(errno(std::fs::metadata(m.path(p))), libc::ENOENT, "{p}");
    }

    // Empty `gone` on the store: its files go, its directories stay on disk.
    std::fs::remove_file(data.join("tree/gone/b.txt")).unwrap();
    std::fs::remove_file(data.join("tree/gone/deeper/c.txt")).unwrap();
    std::thread::sleep(Duration::from_millis(1500)); // the nodes' metadata TTL
    assert_eq!(listed("/data/tree"), ["keep", "top.txt"]);
    assert_eq!(names("/data/tree"), ["keep", "top.txt"]);
    assert_eq!(
        errno(std::fs::metadata(m.path("/data/tree/gone"))),
        libc::ENOENT
    );
    let dest = tempfile::tempdir().unwrap();
    let out = Command::new("cp")
        .arg("-r")
        .arg(m.path("/data/tree"))
        .arg(dest.path().join("copy"))
        .output()
        .unwrap();
    assert!(out.status.success(), "cp -r: {out:?}");
    let copy = dest.path().join("copy");
    let mut copied: Vec<String> = Vec::new();
    let mut todo = vec![copy.clone()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                copied.push(p.strip_prefix(&copy).unwrap().display().to_string());
            }
        }
    }
    copied.sort();
    assert_eq!(copied, ["keep/a.txt", "top.txt"]);
    assert!(std::fs::read(copy.join("top.txt")).unwrap() == files["/data/tree/top.txt"]);

    // statfs: the cluster's cache capacity and use; inode counts unknown (0), not full.
    let stats = rt.block_on(client.shard_stats());
    let capacity: u64 = stats
        .iter()
        .filter_map(|(_, _, s)| s.map(|s| s.capacity_bytes))
        .sum();
    assert_eq!(stats.len(), 6, "three nodes of two shards answer");
    assert!(capacity >= 3 * (200 << 20), "{capacity}");
    std::thread::sleep(pagefs::STATFS_TTL);
    let vfs = statvfs(&m.mp);
    assert_eq!(vfs.f_frsize, 4096);
    assert_eq!(vfs.f_blocks, capacity / 4096);
    assert!(
        vfs.f_bfree < vfs.f_blocks,
        "the copy cached pages: {} of {} free",
        vfs.f_bfree,
        vfs.f_blocks
    );
    assert_eq!((vfs.f_files, vfs.f_ffree), (0, 0));
    let out = Command::new("df").arg("-k").arg(&m.mp).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[1], (capacity / 4096 * 4).to_string(), "{text}");
    let out = Command::new("df").arg("-i").arg(&m.mp).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(!text.contains("100%"), "{text}");
}

fn statvfs(p: &Path) -> libc::statvfs {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut v: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `v` a writable statvfs for the call.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut v) }, 0);
    v
}
