//! `file://` mounts never leave their root (real directories, real symlinks to a file and to a
//! directory outside the root), file:// version tags that see an in-place rewrite which keeps
//! size and mtime, the node's allow-list of local roots, credentials redaction, and mounts a
//! client cannot open reported as unavailable rather than missing, directories without objects
//! hidden everywhere, modification times and version tags in stats and listings alike, and the
//! mount table limit of a node.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::{os::unix::fs::symlink, path::Path};

use bytes::Bytes;
use object_store::MultipartUpload;
use pagestore_mounts::ufs::{
    parse_mount, redact, scrub, system_time, Entry, FileRoots, MountTable, ObjectInfo, UfsError,
};
use pagestore_protocol::frame::PathKind;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// `root/` (mounted at /data) next to `outside/` (never to be touched): `root` holds a real
/// file, a real subdirectory, and symlinks to a secret file and to the outside directory,
/// absolute and relative.
struct Layout {
    _d: tempfile::TempDir,
    root: std::path::PathBuf,
    outside: std::path::PathBuf,
    table: MountTable,
}

fn layout() -> Layout {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    let outside = d.path().join("outside");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::create_dir_all(outside.join("inner")).unwrap();
    std::fs::write(outside.join("secret.txt"), b"SECRET").unwrap();
    std::fs::write(outside.join("inner/deep.txt"), b"DEEP").unwrap();
    std::fs::write(root.join("ok.txt"), b"fine").unwrap();
    std::fs::write(root.join("sub/ok2.txt"), b"fine too").unwrap();
    symlink(outside.join("secret.txt"), root.join("link-file")).unwrap();
    symlink(&outside, root.join("link-dir")).unwrap();
    symlink("../outside/secret.txt", root.join("rel-link")).unwrap();
    symlink("../outside", root.join("sub/rel-dir")).unwrap();
    let table =
        MountTable::new(&[parse_mount(&format!("/data=file://{}", root.display())).unwrap()])
            .unwrap();
    Layout {
        _d: d,
        root,
        outside,
        table,
    }
}

/// Every path and byte of `dir`, recursively (symlinks as their targets' text).
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let ft = e.file_type().unwrap();
            let name = p.strip_prefix(dir).unwrap().display().to_string();
            if ft.is_dir() {
                todo.push(p);
                out.push((name, Vec::new()));
            } else if ft.is_symlink() {
                out.push((
                    name,
                    std::fs::read_link(&p).unwrap().into_os_string().into_vec(),
                ));
            } else {
                out.push((name, std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

use std::os::unix::ffi::OsStringExt;

fn forged(path: &str, size: u64) -> ObjectInfo {
    ObjectInfo {
        path: path.to_string(),
        size,
        version: "anything".into(),
        file_id: 1,
        mtime_ns: 0,
        state: pagestore_protocol::frame::FileState::Stored,
        store_tag: "anything".into(),
    }
}

#[test]
fn reads_heads_and_listings_never_follow_symlinks_out_of_the_root() {
    let l = layout();
    let before = snapshot(&l.outside);
    let t = &l.table;
    rt().block_on(async {
        // The real files are served.
        let ok = t.stat("/data/ok.txt").await.unwrap();
        assert_eq!(&t.read(&ok, 0..100).await.unwrap()[..], b"fine");
        let ok2 = t.stat("/data/sub/ok2.txt").await.unwrap();
        assert_eq!(&t.read(&ok2, 0..100).await.unwrap()[..], b"fine too");
        // A symlink to a file, absolute or relative, and any path through a symlinked
        // directory: not found (head), and no bytes (read, even with a forged version).
        for p in [
            "/data/link-file",
            "/data/rel-link",
            "/data/link-dir/secret.txt",
            "/data/link-dir/inner/deep.txt",
            "/data/sub/rel-dir/secret.txt",
        ] {
            match t.stat(p).await {
                Err(UfsError::NotFound(_)) => {}
                other => panic!("stat {p}: {other:?}"),
            }
            match t.read(&forged(p, 6), 0..6).await {
                Err(UfsError::NotFound(_)) => {}
                other => panic!("read {p}: {other:?}"),
            }
            assert!(t.stat_path(p).await.is_err(), "stat_path {p}");
        }
        // A symlinked directory is not a directory here, and lists nothing.
        for p in [
            "/data/link-dir",
            "/data/sub/rel-dir",
            "/data/link-dir/inner",
        ] {
            assert!(t.stat_path(p).await.is_err(), "stat_path {p}");
            assert_eq!(t.list(p).await.unwrap(), Vec::<Entry>::new(), "list {p}");
        }
        // Listings show the real entries only.
        assert_eq!(
            t.list("/data").await.unwrap(),
            vec![Entry::Dir("sub".into()), Entry::File("ok.txt".into(), 4)]
        );
        assert_eq!(
            t.list("/data/sub").await.unwrap(),
            vec![Entry::File("ok2.txt".into(), 8)]
        );
    });
    assert_eq!(
        snapshot(&l.outside),
        before,
        "nothing outside the root changed"
    );
}

#[test]
fn writes_and_deletes_never_follow_symlinks_out_of_the_root() {
    let l = layout();
    let before = snapshot(&l.outside);
    let t = &l.table;
    rt().block_on(async {
        // PUT into a symlinked directory (existing or new subdirectory below it): refused.
        for p in [
            "/data/link-dir/new.txt",
            "/data/link-dir/secret.txt",
            "/data/link-dir/made/deeper.txt",
            "/data/sub/rel-dir/new.txt",
        ] {
            let r = t.put(p, Bytes::from_static(b"PWNED")).await;
            assert!(r.is_err(), "put {p} accepted");
            let r = t.put_multipart(p).await;
            assert!(r.is_err(), "multipart put {p} accepted");
        }
        // DELETE through a symlinked directory, or of a symlink: refused.
        for p in [
            "/data/link-dir/secret.txt",
            "/data/link-dir/inner/deep.txt",
            "/data/sub/rel-dir/secret.txt",
            "/data/link-file",
        ] {
            assert!(t.delete(p).await.is_err(), "delete {p} accepted");
        }
        // A PUT that names a symlink replaces the link itself (inside the root); the file it
        // pointed to is untouched.
        t.put("/data/rel-link", Bytes::from_static(b"replaced"))
            .await
            .unwrap();
        let info = t.stat("/data/rel-link").await.unwrap();
        assert_eq!(&t.read(&info, 0..100).await.unwrap()[..], b"replaced");
        // Ordinary writes work: new directories, overwrite, multipart, delete.
        t.put("/data/new/deep/x.bin", Bytes::from_static(b"one"))
            .await
            .unwrap();
        t.put("/data/new/deep/x.bin", Bytes::from_static(b"two!"))
            .await
            .unwrap();
        let x = t.stat("/data/new/deep/x.bin").await.unwrap();
        assert_eq!(&t.read(&x, 0..10).await.unwrap()[..], b"two!");
        let mut up = t.put_multipart("/data/new/multi.bin").await.unwrap();
        let a = up.put_part(vec![1u8; 5 << 20].into());
        let b = up.put_part(vec![2u8; 3].into());
        a.await.unwrap();
        b.await.unwrap();
        up.complete().await.unwrap();
        let m = t.stat("/data/new/multi.bin").await.unwrap();
        assert_eq!(m.size, (5 << 20) + 3);
        let got = t.read(&m, (5 << 20) - 2..(5 << 20) + 3).await.unwrap();
        assert_eq!(&got[..], &[1, 1, 2, 2, 2]);
        // A read of more than one chunk streams it whole.
        assert_eq!(t.read(&m, 0..m.size).await.unwrap().len() as u64, m.size);
        t.delete("/data/new/deep/x.bin").await.unwrap();
        assert!(matches!(
            t.stat("/data/new/deep/x.bin").await,
            Err(UfsError::NotFound(_))
        ));
        // No temporary files are left or listed; `deep`, emptied by the delete, stays on
        // disk but holds no object, so it is not listed.
        assert!(l.root.join("new/deep").is_dir());
        assert_eq!(
            t.list("/data/new").await.unwrap(),
            vec![Entry::File("multi.bin".into(), (5 << 20) + 3)]
        );
    });
    assert_eq!(
        snapshot(&l.outside),
        before,
        "nothing outside the root changed"
    );
    let leftovers: Vec<_> = snapshot(&l.root)
        .into_iter()
        .filter(|(n, _)| n.contains("pagestore-tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Sets the mtime of `p` back to `mtime`.
fn set_mtime(p: &Path, mtime: std::time::SystemTime) {
    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    f.set_modified(mtime).unwrap();
}

#[test]
fn an_in_place_rewrite_that_keeps_size_and_mtime_is_a_new_version() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("f.bin");
    std::fs::write(&p, vec![1u8; 10_000]).unwrap();
    let t = MountTable::new(&[parse_mount(&format!("/d=file://{}", d.path().display())).unwrap()])
        .unwrap();
    rt().block_on(async {
        let old = t.stat("/d/f.bin").await.unwrap();
        let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
        // Rewrite in place (same inode, same size), then put the mtime back, as
        // `rsync --inplace -t` or `cp -p` do.
        {
            use std::io::{Seek, Write};
            let mut f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
            f.seek(std::io::SeekFrom::Start(0)).unwrap();
            f.write_all(&[2u8; 10_000]).unwrap();
        }
        set_mtime(&p, mtime);
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!((md.len(), md.modified().unwrap()), (10_000, mtime));
        let new = t.stat("/d/f.bin").await.unwrap();
        assert_ne!(
            new.version, old.version,
            "the version tag must see the rewrite"
        );
        assert_ne!(new.file_id, old.file_id);
        // A read at the old version is refused, never served from the new bytes.
        assert!(matches!(
            t.read(&old, 0..10).await,
            Err(UfsError::Changed { .. })
        ));
        assert_eq!(&t.read(&new, 0..3).await.unwrap()[..], &[2, 2, 2]);
    });
}

#[test]
fn a_node_serves_file_mounts_only_beneath_its_allowed_roots() {
    let d = tempfile::tempdir().unwrap();
    let allowed = d.path().join("allowed");
    std::fs::create_dir_all(allowed.join("set1")).unwrap();
    std::fs::create_dir_all(d.path().join("other")).unwrap();
    symlink("/etc", allowed.join("etc-link")).unwrap();
    let roots = FileRoots::new(&[&allowed]).unwrap();
    let confined = |url: String| MountTable::new_confined(&[("/x".to_string(), url)], &roots);
    // The allowed root itself and directories beneath it are served.
    confined(format!("file://{}", allowed.display())).unwrap();
    confined(format!("file://{}/set1", allowed.display())).unwrap();
    // /etc, a sibling directory, a symlink beneath the root that leads to /etc, and a `..`
    // escape are refused, naming the flag.
    for url in [
        "file:///etc".to_string(),
        format!("file://{}/other", d.path().display()),
        format!("file://{}/etc-link", allowed.display()),
        format!("file://{}/set1/../../other", allowed.display()),
    ] {
        match confined(url.clone()) {
            Err(UfsError::Config(m)) => assert!(m.contains("--allow-file-root"), "{url}: {m}"),
            Err(e) => panic!("{url}: {e}"),
            Ok(_) => panic!("{url} accepted"),
        }
    }
    // An allow-list entry that does not exist is an error that names the flag.
    let e = FileRoots::new(&[d.path().join("missing")]).unwrap_err();
    assert!(e.to_string().contains("--allow-file-root"), "{e}");
    // Other schemes are not affected by the allow-list.
    MountTable::new_confined(
        &[(
            "/s3".to_string(),
            "s3://b/p?endpoint=http://127.0.0.1:9&anonymous=true".to_string(),
        )],
        &roots,
    )
    .unwrap();
}

#[test]
fn credentials_in_urls_are_redacted_everywhere() {
    let url = "s3://bucket/prefix?endpoint=http://euser:epass@127.0.0.1:9&region=r1\
               &access_key_id=AKID&secret_access_key=SKEY";
    let shown = redact(url);
    for secret in ["epass", "euser", "AKID", "SKEY"] {
        assert!(!shown.contains(secret), "{shown}");
    }
    assert!(
        shown.contains("region=r1") && shown.contains("127.0.0.1"),
        "{shown}"
    );
    let shown = redact("s3://uuser:upass@bucket/prefix?anonymous=true");
    assert!(
        !shown.contains("upass") && !shown.contains("uuser"),
        "{shown}"
    );
    assert_eq!(
        scrub("error sending request for url (http://a:b@host:9/x?y): refused"),
        "error sending request for url (http://host:9/x?y): refused"
    );
    // The public mount list and configuration errors carry no secrets either.
    let t = MountTable::new(&[("/s3".to_string(), url.to_string())]).unwrap();
    let public = &t.public_mounts()[0].url;
    assert!(
        !public.contains("epass") && !public.contains("SKEY"),
        "{public}"
    );
    std::env::remove_var("AWS_ACCESS_KEY_ID");
    std::env::remove_var("AWS_SECRET_ACCESS_KEY");
    let e = MountTable::new(&[(
        "/s3".to_string(),
        "s3://bucket/p?endpoint=http://euser:epass@127.0.0.1:9".to_string(),
    )])
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("no credentials") && !e.contains("epass"), "{e}");
}

#[test]
fn a_mount_this_client_cannot_open_is_unavailable_not_missing() {
    std::env::remove_var("AWS_ACCESS_KEY_ID");
    std::env::remove_var("AWS_SECRET_ACCESS_KEY");
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("here.txt"), b"x").unwrap();
    let t = MountTable::new_partial(&[
        (
            "/s3".to_string(),
            "s3://bucket/p?endpoint=http://127.0.0.1:9".to_string(),
        ),
        (
            "/local".to_string(),
            format!("file://{}", d.path().display()),
        ),
    ]);
    rt().block_on(async {
        match t.stat("/s3/some/object").await {
            Err(UfsError::Config(m)) => assert!(m.contains("no credentials"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            t.stat_path("/s3").await,
            Ok(pagestore_protocol::frame::PathKind::Dir { mtime_ns: 0 })
        ));
        assert!(t.stat("/local/here.txt").await.is_ok());
        // Outside every mount, a path is still simply not there.
        assert!(matches!(
            t.stat("/elsewhere/x").await,
            Err(UfsError::NotFound(_))
        ));
        let root = t.list("/").await.unwrap();
        assert!(root.contains(&Entry::Dir("s3".into())), "{root:?}");
    });
}

#[test]
fn directories_without_objects_are_neither_listed_nor_directories() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    for dir in [
        "empty",
        "nested/deeper/deepest",
        "links",
        "full/a/b",
        "emptied/sub",
    ] {
        std::fs::create_dir_all(r.join(dir)).unwrap();
    }
    symlink("/etc/hostname", r.join("links/l")).unwrap();
    std::fs::write(r.join("full/a/b/leaf.txt"), b"leaf").unwrap();
    std::fs::write(r.join("emptied/sub/x.txt"), b"x").unwrap();
    std::fs::write(r.join("top.txt"), b"top").unwrap();
    let t =
        MountTable::new(&[parse_mount(&format!("/d=file://{}", r.display())).unwrap()]).unwrap();
    rt().block_on(async {
        let names = |v: Vec<pagestore_protocol::frame::DirEntry>| -> Vec<String> {
            v.into_iter().map(|e| e.name).collect()
        };
        assert_eq!(
            names(t.list_entries("/d").await.unwrap()),
            ["emptied", "full", "top.txt"]
        );
        assert_eq!(names(t.list_entries("/d/full").await.unwrap()), ["a"]);
        for p in ["/d/empty", "/d/nested", "/d/nested/deeper", "/d/links"] {
            match t.stat_path(p).await {
                Err(UfsError::NotFound(_)) => {}
                other => panic!("stat_path {p}: {other:?}"),
            }
            assert!(t.list_entries(p).await.unwrap().is_empty(), "{p}");
        }
        assert_eq!(t.stat_path("/d/full/a").await.unwrap(), PathKind::DIR);
        assert_eq!(t.stat_path("/d/emptied").await.unwrap(), PathKind::DIR);
        // The last object of a directory goes (directories stay behind on disk): the
        // directory goes from listings and stat at once.
        t.delete("/d/emptied/sub/x.txt").await.unwrap();
        assert!(r.join("emptied/sub").is_dir());
        assert_eq!(
            names(t.list_entries("/d").await.unwrap()),
            ["full", "top.txt"]
        );
        assert!(matches!(
            t.stat_path("/d/emptied").await,
            Err(UfsError::NotFound(_))
        ));
        // An object written where such a directory stayed behind takes its place, as on an
        // object store, where there is nothing at that key.
        t.put("/d/emptied", Bytes::from_static(b"now a file"))
            .await
            .unwrap();
        assert_eq!(std::fs::read(r.join("emptied")).unwrap(), b"now a file");
        // Not where a directory still holds an object, or anything else (a symlink): the
        // write fails and the directory keeps all it held.
        assert!(t.put("/d/full", Bytes::from_static(b"x")).await.is_err());
        assert_eq!(std::fs::read(r.join("full/a/b/leaf.txt")).unwrap(), b"leaf");
        assert!(t.put("/d/links", Bytes::from_static(b"x")).await.is_err());
        assert!(r.join("links/l").symlink_metadata().unwrap().is_symlink());
        // A new object anywhere beneath brings it back.
        std::fs::write(r.join("nested/deeper/deepest/n.txt"), b"n").unwrap();
        assert_eq!(
            names(t.list_entries("/d").await.unwrap()),
            ["emptied", "full", "nested", "top.txt"]
        );
    });
}

#[test]
fn stats_and_listings_carry_the_stores_modification_time_and_version() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("old.bin");
    std::fs::write(&p, vec![7u8; 1234]).unwrap();
    // 2001-09-09T01:46:40.123456789Z.
    let ns = 1_000_000_000_123_456_789i64;
    set_mtime(&p, system_time(ns));
    let t = MountTable::new(&[parse_mount(&format!("/d=file://{}", d.path().display())).unwrap()])
        .unwrap();
    rt().block_on(async {
        let info = t.stat("/d/old.bin").await.unwrap();
        assert_eq!(info.mtime_ns, ns);
        assert_eq!(info.modified(), system_time(ns));
        match t.stat_path("/d/old.bin").await.unwrap() {
            PathKind::File {
                mtime_ns,
                version_tag,
                size,
                ..
            } => assert_eq!(
                (mtime_ns, version_tag, size),
                (ns, info.version.clone(), 1234)
            ),
            other => panic!("{other:?}"),
        }
        let listed = t.list_entries("/d").await.unwrap();
        assert_eq!(listed.len(), 1);
        let e = &listed[0];
        assert_eq!(
            (
                e.name.as_str(),
                e.is_dir,
                e.size,
                &e.version_tag,
                e.mtime_ns
            ),
            ("old.bin", false, 1234, &info.version, ns),
            "a listing says what a stat says"
        );
    });
    // Times before the epoch survive too.
    assert_eq!(
        system_time(-1_500_000_000),
        std::time::SystemTime::UNIX_EPOCH - std::time::Duration::from_millis(1500)
    );
}

#[test]
fn a_node_refuses_a_mount_table_clients_could_not_receive() {
    let d = tempfile::tempdir().unwrap();
    let roots = FileRoots::new(&[d.path()]).unwrap();
    let url = format!("file://{}", d.path().display());
    let table = |n: usize| -> Vec<(String, String)> {
        (0..n).map(|i| (format!("/m{i}"), url.clone())).collect()
    };
    let t = MountTable::new_confined(&table(256), &roots).unwrap();
    assert_eq!(t.public_mounts().len(), 256);
    let e = MountTable::new_confined(&table(257), &roots)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("257 mounts, at most MAX_MOUNTS = 256"), "{e}");
    // A client's own table has no such limit (it is never sent).
    assert_eq!(
        MountTable::new(&table(300)).unwrap().public_mounts().len(),
        300
    );
    // Long URLs: the bytes limit.
    let long = format!("{url}?{}", "x=1&".repeat(200));
    let few: Vec<(String, String)> = (0..30).map(|i| (format!("/m{i}"), long.clone())).collect();
    let e = MountTable::new_confined(&few, &roots)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("MAX_MOUNT_TABLE_BYTES = 16384"), "{e}");
}

/// Small reads of a `file://` store run on the calling task's thread, so they finish while
/// every blocking-pool thread is taken; a large read (and a stat) goes to the pool and waits
/// for one.
#[test]
fn small_reads_run_on_the_callers_thread_and_large_ones_in_the_blocking_pool() {
    use object_store::{path::Path as StorePath, GetOptions, GetRange, ObjectStore};
    use pagestore_mounts::localfs::LocalStore;
    use std::time::Duration;

    let d = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(d.path().join("f.bin"), &data).unwrap();
    let store = std::sync::Arc::new(LocalStore::new(d.path()).unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let loc = StorePath::from("f.bin");
    let ranged = |r: std::ops::Range<u64>| GetOptions {
        range: Some(GetRange::Bounded(r)),
        ..GetOptions::default()
    };
    rt.block_on(async {
        let (release, held) = std::sync::mpsc::channel::<()>();
        let blocker = tokio::task::spawn_blocking(move || held.recv().unwrap());
        let quick = async {
            let got = store
                .get_opts(&loc, ranged(4096..4096 + 65536))
                .await
                .unwrap();
            assert_eq!(got.bytes().await.unwrap(), data[4096..4096 + 65536]);
        };
        tokio::time::timeout(Duration::from_secs(20), quick)
            .await
            .expect("a small read waited for the blocking pool");
        let (s2, l2, whole) = (store.clone(), loc.clone(), ranged(0..data.len() as u64));
        let large = tokio::spawn(async move { s2.get_opts(&l2, whole).await.map(|_| ()) });
        let (s3, l3) = (store.clone(), loc.clone());
        let head = tokio::spawn(async move {
            let o = GetOptions {
                head: true,
                ..GetOptions::default()
            };
            s3.get_opts(&l3, o).await.map(|r| r.meta.size)
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !large.is_finished(),
            "a large read ran while the pool was taken"
        );
        assert!(!head.is_finished(), "a stat ran while the pool was taken");
        release.send(()).unwrap();
        blocker.await.unwrap();
        large.await.unwrap().unwrap();
        assert_eq!(head.await.unwrap().unwrap(), data.len() as u64);
        let all = store
            .get_opts(&loc, ranged(0..data.len() as u64))
            .await
            .unwrap();
        assert_eq!(all.bytes().await.unwrap(), data[..]);
    });
}

/// Three slow inline reads in a row send a store's reads to the blocking pool for the back-off;
/// a fast read between slow ones starts the count again.
#[test]
fn slow_reads_in_a_row_turn_inline_reads_off_for_a_while() {
    use pagestore_mounts::localfs::InlineGate;
    let g = InlineGate::default();
    let slow = InlineGate::SLOW * 2;
    let fast = InlineGate::SLOW / 2;
    let back_off = InlineGate::BACK_OFF.as_millis() as u64;
    assert!(g.allows(0));
    g.took(slow, 10);
    g.took(slow, 11);
    g.took(fast, 12);
    g.took(slow, 13);
    g.took(slow, 14);
    assert!(g.allows(15), "a fast read in between restarts the count");
    g.took(slow, 16);
    assert!(!g.allows(16) && !g.allows(16 + back_off - 1));
    assert!(g.allows(16 + back_off));
}
