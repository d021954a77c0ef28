//! The mount table over real local directories (object_store's file backend): resolution,
//! version-pinned reads, changed objects, listing, bad paths and configuration errors.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::os::unix::ffi::OsStrExt;

use pagestore_mounts::ufs::{parse_mount, Entry, MountTable, PutOutcome, UfsError};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn setup() -> (tempfile::TempDir, MountTable) {
    let d = tempfile::tempdir().unwrap();
    let a = d.path().join("a");
    let b = d.path().join("b");
    std::fs::create_dir_all(a.join("episodes")).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    std::fs::write(
        a.join("episodes/e1.bin"),
        (0..100_000u32).map(|i| i as u8).collect::<Vec<_>>(),
    )
    .unwrap();
    std::fs::write(a.join("manifest.txt"), b"hello").unwrap();
    std::fs::write(b.join("x"), b"in b").unwrap();
    let mounts = vec![
        parse_mount(&format!("/data=file://{}", a.display())).unwrap(),
        parse_mount(&format!("/data/inner=file://{}", b.display())).unwrap(),
    ];
    (d, MountTable::new(&mounts).unwrap())
}

#[test]
fn reads_ranges_at_a_pinned_version_and_notices_changes() {
    let (d, t) = setup();
    rt().block_on(async {
        let info = t.stat("/data/episodes/e1.bin").await.unwrap();
        assert_eq!(info.size, 100_000);
        let got = t.read(&info, 1000..1010).await.unwrap();
        assert_eq!(
            &got[..],
            &(1000..1010u32).map(|i| i as u8).collect::<Vec<_>>()[..]
        );
        // Past the end: short, then empty.
        assert_eq!(t.read(&info, 99_990..200_000).await.unwrap().len(), 10);
        assert!(t.read(&info, 100_000..100_010).await.unwrap().is_empty());
        // Longest prefix wins.
        let inner = t.stat("/data/inner/x").await.unwrap();
        assert_eq!(&t.read(&inner, 0..100).await.unwrap()[..], b"in b");
        // Rewrite the object: new version, new file id; the old version is refused, not mixed.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(d.path().join("a/episodes/e1.bin"), vec![7u8; 100_001]).unwrap();
        let new = t.stat("/data/episodes/e1.bin").await.unwrap();
        assert_ne!(new.version, info.version);
        assert_ne!(new.file_id, info.file_id);
        assert!(matches!(
            t.read(&info, 0..10).await,
            Err(UfsError::Changed { .. })
        ));
        assert_eq!(&t.read(&new, 0..3).await.unwrap()[..], &[7, 7, 7]);
    });
}

#[test]
fn unknown_and_unsafe_paths_are_errors() {
    let (_d, t) = setup();
    rt().block_on(async {
        assert!(matches!(
            t.stat("/data/nope").await,
            Err(UfsError::NotFound(_))
        ));
        assert!(matches!(
            t.stat("/elsewhere/x").await,
            Err(UfsError::NotFound(_))
        ));
        for bad in ["/data/../etc/passwd", "data/x", "/data/./x", "/data/a\0b"] {
            assert!(
                matches!(t.stat(bad).await, Err(UfsError::BadPath(_))),
                "{bad}"
            );
        }
    });
}

#[test]
fn listing_shows_objects_directories_and_mount_points() {
    let (_d, t) = setup();
    rt().block_on(async {
        let root = t.list("/").await.unwrap();
        assert_eq!(root, vec![Entry::Dir("data".into())]);
        let data = t.list("/data").await.unwrap();
        assert!(data.contains(&Entry::Dir("episodes".into())), "{data:?}");
        assert!(data.contains(&Entry::Dir("inner".into())), "{data:?}");
        assert!(
            data.contains(&Entry::File("manifest.txt".into(), 5)),
            "{data:?}"
        );
        assert_eq!(
            t.list("/data/episodes").await.unwrap(),
            vec![Entry::File("e1.bin".into(), 100_000)]
        );
    });
}

#[test]
fn the_head_of_a_listing_is_the_start_of_the_whole_listing() {
    let d = tempfile::tempdir().unwrap();
    let a = d.path().join("a");
    let b = d.path().join("b");
    std::fs::create_dir_all(&b).unwrap();
    std::fs::write(b.join("x"), b"in b").unwrap();
    // Files, directories that hold objects (listed), and what a listing leaves out: an empty
    // directory, a symlink, a FIFO, a name that is not UTF-8; among them the name of a mount
    // point below the directory ("m050").
    for i in 0..120u32 {
        let name = format!("m{i:03}");
        match i % 6 {
            0 => {
                std::fs::create_dir_all(a.join(&name)).unwrap();
                std::fs::write(a.join(&name).join("obj"), b"o").unwrap();
            }
            1 => std::fs::create_dir_all(a.join(&name)).unwrap(),
            2 => std::os::unix::fs::symlink("m000", a.join(&name)).unwrap(),
            3 => {
                let c = std::ffi::CString::new(a.join(&name).as_os_str().as_encoded_bytes());
                let c = c.unwrap();
                // SAFETY: `c` is a NUL-terminated path that lives through the call.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            }
            _ => std::fs::write(a.join(&name), vec![1u8; i as usize]).unwrap(),
        }
    }
    std::fs::write(a.join(std::ffi::OsStr::from_bytes(b"m0\xff")), b"x").unwrap();
    let mounts = vec![
        parse_mount(&format!("/data=file://{}", a.display())).unwrap(),
        parse_mount(&format!("/data/m050=file://{}", b.display())).unwrap(),
    ];
    let t = MountTable::new(&mounts).unwrap();
    rt().block_on(async {
        let all = t.list_entries("/data").await.unwrap();
        assert_eq!(all.len(), 61, "{all:?}");
        assert!(t.has_list_head("/data"));
        for max in [1, 2, 7, 8, 9, 10, 50, 60, 61, 62, 500] {
            let (head, more) = t.list_head("/data", max).await.unwrap();
            assert!(
                !head.is_empty() && head.len() <= max,
                "{max}: {}",
                head.len()
            );
            assert_eq!(head, all[..head.len()], "max {max}");
            if head.len() < all.len() {
                assert!(more, "max {max}: entries left out, and no more");
            }
            if max >= all.len() + 2 {
                assert!(!more && head == all, "max {max}");
            }
        }
        // Nothing there: an empty head, as the listing is empty.
        assert_eq!(t.list_head("/data/none", 5).await.unwrap(), (vec![], false));
    });
}

#[test]
fn configuration_errors_are_clear() {
    let bad = |spec: &str| match parse_mount(spec).and_then(|m| MountTable::new(&[m])) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("{spec} accepted"),
    };
    assert!(bad("data=file:///tmp").contains("must start with /"));
    assert!(bad("/data").contains("/LOGICAL=URL"));
    assert!(bad("/data=file:///definitely/not/here").contains("not a directory"));
    assert!(bad("/data=ftp://x/y").contains("unknown scheme"));
    // GCS and Azure: credentials are required unless anonymous, exactly like S3.
    for v in [
        "GOOGLE_SERVICE_ACCOUNT",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_STORAGE_ACCOUNT_KEY",
    ] {
        std::env::remove_var(v);
    }
    let e = bad("/g=gs://bucket/x");
    assert!(
        e.contains("no credentials") && e.contains("service_account_path"),
        "{e}"
    );
    let e = bad("/a=az://container/x");
    assert!(e.contains("no storage account"), "{e}");
    let e = bad("/a=az://container/x?account=acct");
    assert!(
        e.contains("no credentials") && e.contains("access_key"),
        "{e}"
    );
    for ok in [
        "/g=gs://bucket/x?anonymous=true",
        "/g=gs://bucket/x?anonymous=true&endpoint=http://127.0.0.1:9",
        "/a=az://container/x?account=acct&anonymous=true",
        "/a=az://container/x?account=acct&access_key=a2V5&endpoint=http://127.0.0.1:9/acct",
    ] {
        MountTable::new(&[parse_mount(ok).unwrap()]).unwrap();
    }
    // Secrets never leave in the public mount list.
    let t = MountTable::new(&[parse_mount(
        "/a=az://container/x?account=acct&access_key=U0VDUkVUS0VZ&endpoint=http://127.0.0.1:9/acct",
    )
    .unwrap()])
    .unwrap();
    let shown = &t.public_mounts()[0].url;
    assert!(
        !shown.contains("U0VDUkVUS0VZ") && shown.contains("account=acct"),
        "{shown}"
    );
    // No credentials and not anonymous: refused, never a silent cloud-metadata lookup.
    std::env::remove_var("AWS_ACCESS_KEY_ID");
    std::env::remove_var("AWS_SECRET_ACCESS_KEY");
    let e = bad("/s3=s3://bucket/prefix?endpoint=http://127.0.0.1:9");
    assert!(
        e.contains("no credentials") && e.contains("anonymous=true"),
        "{e}"
    );
    // With credentials, or anonymous, the mount is accepted (nothing is contacted yet).
    let ok = parse_mount(
        "/s3=s3://bucket/prefix?endpoint=http://127.0.0.1:9&access_key_id=a&secret_access_key=b",
    )
    .unwrap();
    MountTable::new(&[ok]).unwrap();
    let anon = parse_mount("/pub=s3://bucket?endpoint=http://127.0.0.1:9&anonymous=true").unwrap();
    MountTable::new(&[anon]).unwrap();
    // An egress price must be a plain number of at least 0; a valid one is shown with the mount.
    for price in ["-1", "abc", "1e9", ""] {
        let e = bad(&format!("/d=file:///tmp?egress_usd_per_tb={price}"));
        assert!(e.contains("egress_usd_per_tb") && e.contains("/d/"), "{e}");
    }
    let priced = MountTable::new(&[parse_mount(
        "/pub=s3://bucket?endpoint=http://127.0.0.1:9&anonymous=true&egress_usd_per_tb=90.5",
    )
    .unwrap()])
    .unwrap();
    let shown = &priced.public_mounts()[0].url;
    assert!(shown.contains("egress_usd_per_tb=90.5"), "{shown}");
    let dup = vec![
        parse_mount("/d=file:///tmp").unwrap(),
        parse_mount("/d/=file:///tmp").unwrap(),
    ];
    assert!(MountTable::new(&dup)
        .err()
        .unwrap()
        .to_string()
        .contains("mounted twice"));
}

#[test]
fn conditional_writes_deletes_copies_and_versioned_listings_on_file_mounts() {
    use object_store::{PutMode, UpdateVersion};
    let (_d, t) = setup();
    let update = |v: &str| {
        PutMode::Update(UpdateVersion {
            e_tag: Some(format!("\"{v}\"")),
            version: None,
        })
    };
    rt().block_on(async {
        let p = "/data/cond/x";
        // Create: only where nothing is. The version the write answers is stat's.
        let made = t
            .put_if(p, "one".into(), PutMode::Create, Default::default())
            .await
            .unwrap();
        assert_eq!(
            made,
            PutOutcome::Written(Some(t.stat(p).await.unwrap().version))
        );
        assert!(!t
            .put_if(p, "two".into(), PutMode::Create, Default::default())
            .await
            .unwrap()
            .written());
        let v1 = t.stat(p).await.unwrap().version;
        // Update: only from the version named.
        assert!(t
            .put_if(p, "two".into(), update(&v1), Default::default())
            .await
            .unwrap()
            .written());
        let v2 = t.stat(p).await.unwrap().version;
        assert_ne!(v1, v2);
        assert!(!t
            .put_if(p, "three".into(), update(&v1), Default::default())
            .await
            .unwrap()
            .written());
        assert!(!t
            .put_if(
                "/data/cond/none",
                "x".into(),
                update(&v1),
                Default::default()
            )
            .await
            .unwrap()
            .written());
        let info = t.stat(p).await.unwrap();
        assert_eq!(&t.read(&info, 0..10).await.unwrap()[..], b"two");
        // A multipart write completing under a condition.
        let mut u = t
            .put_multipart_if(p, update(&v1), Default::default())
            .await
            .unwrap();
        u.put_part(bytes::Bytes::from_static(b"stale").into())
            .await
            .unwrap();
        assert!(matches!(
            u.complete().await,
            Err(object_store::Error::Precondition { .. })
        ));
        let mut u = t
            .put_multipart_if(p, update(&v2), Default::default())
            .await
            .unwrap();
        u.put_part(bytes::Bytes::from_static(b"fresh").into())
            .await
            .unwrap();
        u.complete().await.unwrap();
        let v3 = t.stat(p).await.unwrap().version;
        let mut u = t
            .put_multipart_if(p, PutMode::Create, Default::default())
            .await
            .unwrap();
        u.put_part(bytes::Bytes::from_static(b"x").into())
            .await
            .unwrap();
        assert!(u.complete().await.is_err());
        // Listed versions are stat's versions.
        let listed = t.list_entries("/data/cond").await.unwrap();
        assert_eq!(
            listed
                .iter()
                .map(|e| (e.name.as_str(), e.size, e.version_tag.as_str()))
                .collect::<Vec<_>>(),
            vec![("x", 5, v3.as_str())]
        );
        // Copy inside a mount; between mounts it is not the store's to do.
        t.copy(p, "/data/cond/y").await.unwrap();
        let y = t.stat("/data/cond/y").await.unwrap();
        assert_eq!(&t.read(&y, 0..10).await.unwrap()[..], b"fresh");
        assert!(matches!(
            t.copy(p, "/data/inner/y").await,
            Err(UfsError::Store(
                _,
                object_store::Error::NotImplemented { .. }
            ))
        ));
        assert!(matches!(
            t.copy("/data/cond/none", "/data/cond/z").await,
            Err(UfsError::NotFound(_))
        ));
        // Conditional delete.
        assert!(!t.delete_if(p, &v2).await.unwrap());
        assert!(t.stat(p).await.is_ok());
        assert!(t.delete_if(p, &format!("\"{v3}\"")).await.unwrap());
        assert!(matches!(t.stat(p).await, Err(UfsError::NotFound(_))));
        assert!(matches!(
            t.delete_if(p, &v3).await,
            Err(UfsError::NotFound(_))
        ));
    });
}

#[test]
fn concurrent_conditional_updates_from_one_version_let_exactly_one_win() {
    use object_store::{PutMode, UpdateVersion};
    let (_d, t) = setup();
    let t = std::sync::Arc::new(t);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let p = "/data/race";
        t.put(p, "base".into()).await.unwrap();
        let v = t.stat(p).await.unwrap().version;
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let (t, v) = (t.clone(), v.clone());
                tokio::spawn(async move {
                    let mode = PutMode::Update(UpdateVersion {
                        e_tag: Some(v),
                        version: None,
                    });
                    t.put_if(p, format!("writer {i}").into(), mode, Default::default())
                        .await
                        .unwrap()
                        .written()
                })
            })
            .collect();
        let mut won = 0;
        for task in tasks {
            if task.await.unwrap() {
                won += 1;
            }
        }
        assert_eq!(won, 1, "compare-and-swap from one version: one writer wins");
        let creates: Vec<_> = (0..8)
            .map(|i| {
                let t = t.clone();
                tokio::spawn(async move {
                    t.put_if(
                        "/data/race-new",
                        format!("{i}").into(),
                        PutMode::Create,
                        Default::default(),
                    )
                    .await
                    .unwrap()
                    .written()
                })
            })
            .collect();
        let mut created = 0;
        for c in creates {
            if c.await.unwrap() {
                created += 1;
            }
        }
        assert_eq!(created, 1, "create-only: one writer creates");
    });
}

#[test]
fn attributes_are_kept_with_objects_of_file_mounts_and_copied_with_them() {
    use object_store::{Attribute, Attributes, PutMode};
    let (d, t) = setup();
    rt().block_on(async {
        let mut attrs = Attributes::new();
        attrs.insert(Attribute::ContentType, "text/plain; charset=utf-8".into());
        attrs.insert(Attribute::CacheControl, "max-age=60".into());
        attrs.insert(Attribute::Metadata("mtime".into()), "1700000000".into());
        assert!(t
            .put_if(
                "/data/attr/a",
                "hello".into(),
                PutMode::Overwrite,
                attrs.clone()
            )
            .await
            .unwrap()
            .written());
        let got = t.object_attributes("/data/attr/a").await.unwrap();
        if !xattrs_work(d.path()) {
            // Not kept, and not an error: the object itself was written.
            assert!(got.is_empty());
            return;
        }
        assert_eq!(got, attrs);
        t.copy("/data/attr/a", "/data/attr/b").await.unwrap();
        assert_eq!(t.object_attributes("/data/attr/b").await.unwrap(), attrs);
        let mut u = t
            .put_multipart_if("/data/attr/c", PutMode::Overwrite, attrs.clone())
            .await
            .unwrap();
        u.put_part(bytes::Bytes::from_static(b"parts").into())
            .await
            .unwrap();
        u.complete().await.unwrap();
        assert_eq!(t.object_attributes("/data/attr/c").await.unwrap(), attrs);
        // A multipart write given late attributes keeps those it was given last, set before
        // its completion; given none, those it started with.
        for late_too in [true, false] {
            let late = pagestore_mounts::localfs::LateAttributes::default();
            let mut u = t
                .put_multipart_late(
                    "/data/attr/d",
                    PutMode::Overwrite,
                    attrs.clone(),
                    Some(&late),
                )
                .await
                .unwrap();
            u.put_part(bytes::Bytes::from_static(b"late").into())
                .await
                .unwrap();
            let mut later = Attributes::new();
            later.insert(Attribute::Metadata("digest".into()), "abc".into());
            if late_too {
                late.set(later.clone());
            }
            u.complete().await.unwrap();
            let want = if late_too { later } else { attrs.clone() };
            assert_eq!(t.object_attributes("/data/attr/d").await.unwrap(), want);
        }
        // The attributes describe the bytes they were written with: a copy keeping the bytes,
        // size and mtime (`cp -a`) keeps them; the file rewritten in place (which keeps its
        // extended attributes) has none, whatever its size.
        let a = d.path().join("a/attr/a");
        let kept = d.path().join("a/attr/kept");
        assert!(std::process::Command::new("cp")
            .arg("-a")
            .arg(&a)
            .arg(&kept)
            .status()
            .unwrap()
            .success());
        assert_eq!(t.object_attributes("/data/attr/kept").await.unwrap(), attrs);
        for (bytes, what) in [(&b"HELLO"[..], "same size"), (b"hello, again", "longer")] {
            std::thread::sleep(std::time::Duration::from_millis(10));
            std::os::unix::fs::FileExt::write_all_at(
                &std::fs::File::options().write(true).open(&kept).unwrap(),
                bytes,
                0,
            )
            .unwrap();
            assert!(
                t.object_attributes("/data/attr/kept")
                    .await
                    .unwrap()
                    .is_empty(),
                "{what}"
            );
        }
        // An object written without attributes has none.
        t.put("/data/attr/plain", "x".into()).await.unwrap();
        assert!(t
            .object_attributes("/data/attr/plain")
            .await
            .unwrap()
            .is_empty());
        assert!(matches!(
            t.object_attributes("/data/attr/none").await,
            Err(UfsError::NotFound(_))
        ));
    });
}

/// Whether the file system of `dir` keeps user extended attributes.
fn xattrs_work(dir: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let f = dir.join("xattr-probe");
    std::fs::write(&f, b"").unwrap();
    let path = std::ffi::CString::new(f.as_os_str().as_bytes()).unwrap();
    let name = std::ffi::CString::new("user.probe").unwrap();
    // SAFETY: both strings are NUL-terminated and the value a live 1-byte buffer for the call.
    unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), b"x".as_ptr().cast(), 1, 0) == 0 }
}

/// An emulated distant store delays writes as it delays reads: every request its latency, and
/// a put or a multipart part its size at the bandwidth (per request), so that a write straight
/// to it and a flush to it take the time a distant store would take.
#[test]
fn emulated_stores_delay_writes_by_latency_and_size() {
    use std::time::{Duration, Instant};
    let d = tempfile::tempdir().unwrap();
    // 40 ms per request, 10 MB/s per request: 1 MB takes 100 ms on top.
    let url = format!(
        "file://{}?emulate_latency_ms=40&emulate_mbps=10",
        d.path().display()
    );
    let t = MountTable::new(&[("/far".to_string(), url)]).unwrap();
    let mb = |n: usize| bytes::Bytes::from(vec![7u8; n * 1_000_000]);
    let at_least = |start: Instant, ms: u64, what: &str| {
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(ms), "{what} took {took:?}");
    };
    rt().block_on(async {
        let start = Instant::now();
        t.put("/far/a", mb(1)).await.unwrap();
        at_least(start, 140, "a put of 1 MB");

        let start = Instant::now();
        t.put_if(
            "/far/b",
            mb(2),
            object_store::PutMode::Overwrite,
            Default::default(),
        )
        .await
        .unwrap();
        at_least(start, 240, "a conditional put of 2 MB");

        let start = Instant::now();
        let mut up = t.put_multipart("/far/c").await.unwrap();
        at_least(start, 40, "starting a multipart write");
        let start = Instant::now();
        let (p1, p2) = (up.put_part(mb(1).into()), up.put_part(mb(1).into()));
        let (r1, r2) = futures_util::future::join(p1, p2).await;
        r1.unwrap();
        r2.unwrap();
        at_least(start, 140, "two parts of 1 MB at once");
        let start = Instant::now();
        up.complete().await.unwrap();
        at_least(start, 40, "completing a multipart write");
        assert_eq!(
            std::fs::read(d.path().join("c")).unwrap(),
            vec![7u8; 2_000_000]
        );

        let start = Instant::now();
        t.delete("/far/a").await.unwrap();
        at_least(start, 40, "a delete");
        assert!(!d.path().join("a").exists());
    });
}

use pagestore_mounts::ufs::PartUploads;
use std::sync::{
    atomic::{AtomicBool, AtomicUsize, Ordering},
    Arc,
};
use std::time::Duration;

/// Counters of the part futures below: how many run now, and the most that ran at once.
fn counters() -> (Arc<AtomicUsize>, Arc<AtomicUsize>, Arc<AtomicBool>) {
    (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(false)),
    )
}

/// A part future that counts itself running until `open` is set, then answers `result`.
fn part(
    running: &Arc<AtomicUsize>,
    peak: &Arc<AtomicUsize>,
    open: &Arc<AtomicBool>,
    result: object_store::Result<()>,
) -> object_store::UploadPart {
    let (running, peak, open) = (running.clone(), peak.clone(), open.clone());
    Box::pin(async move {
        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
        peak.fetch_max(now, Ordering::SeqCst);
        while !open.load(Ordering::SeqCst) {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        running.fetch_sub(1, Ordering::SeqCst);
        result
    })
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn part_uploads_run_on_their_own_and_at_most_limit_at_once() {
    multi_thread().block_on(async {
        let (running, peak, open) = counters();
        let mut parts = PartUploads::new(2);
        for _ in 0..2 {
            parts
                .start(part(&running, &peak, &open, Ok(())))
                .await
                .unwrap();
        }
        // Both run though nobody awaits them (a list of part futures awaited oldest first
        // would have started neither).
        tokio::time::timeout(Duration::from_secs(5), async {
            while running.load(Ordering::SeqCst) < 2 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("both parts started on their own");
        // A third waits for room while both are running.
        let third = part(&running, &peak, &open, Ok(()));
        tokio::time::timeout(Duration::from_millis(100), parts.start(third))
            .await
            .expect_err("no room for a third part");
        open.store(true, Ordering::SeqCst);
        for _ in 0..3 {
            parts
                .start(part(&running, &peak, &open, Ok(())))
                .await
                .unwrap();
        }
        parts.finish().await.unwrap();
        assert!(parts.is_empty());
        assert_eq!(running.load(Ordering::SeqCst), 0);
        assert_eq!(
            peak.load(Ordering::SeqCst),
            2,
            "never more than the limit at once"
        );
    });
}

#[test]
fn a_failed_part_is_reported_and_the_rest_aborted_when_dropped() {
    multi_thread().block_on(async {
        let (running, peak, open) = counters();
        let mut parts = PartUploads::new(4);
        parts
            .start(part(&running, &peak, &open, Ok(())))
            .await
            .unwrap();
        let failing: object_store::UploadPart = Box::pin(async {
            Err(object_store::Error::Generic {
                store: "test",
                source: "the store said no".into(),
            })
        });
        parts.start(failing).await.unwrap();
        let e = tokio::time::timeout(Duration::from_secs(5), parts.finish())
            .await
            .expect("the failure comes back while the other part still runs")
            .unwrap_err();
        assert!(e.to_string().contains("the store said no"), "{e}");
        assert_eq!(parts.len(), 1, "the other part is still running");
        drop(parts);
        // Had the dropped set left its part running, it would now end and count itself out.
        open.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(running.load(Ordering::SeqCst), 1, "the part was aborted");
    });
}
