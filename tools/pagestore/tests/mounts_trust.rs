//! Trust at the mounts, with real `pagestored` processes: symlinks in a `file://` mount are not
//! served, a file rewritten in place with its size and mtime restored is never spliced from old
//! cached pages and new loaded ones, a node refuses `file://` mounts outside its allowed roots,
//! and an under storage that cannot be reached is an honest error (not "not found") that does
//! not make the client back off a healthy node, with the endpoint's credentials never shown.
#![allow(clippy::unwrap_used)]

mod common;

use std::{
    os::unix::fs::symlink,
    process::Command,
    time::{Duration, Instant},
};

use common::{bytes, Cluster, PAGESTORED};
use pagestore_client::{ClientOptions, Error};

const MIB: usize = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_mount_serves_no_symlink_and_never_splices_an_in_place_rewrite() {
    let (dir, mut s) = common::settings();
    let data = dir.path().join("data");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), b"TOP-SECRET").unwrap();
    symlink(outside.join("secret"), data.join("link")).unwrap();
    symlink(&outside, data.join("dirlink")).unwrap();
    let v1 = bytes(41, 3 * MIB);
    std::fs::write(data.join("obj"), &v1).unwrap();
    s.mounts = vec![format!("/data=file://{}", data.display())];
    s.nodes = 1;
    let c = Cluster::start(dir, s);
    let client = c.client(ClientOptions::default()).await;

    // Symlinks: not listed, not readable, not through a symlinked directory.
    let names: Vec<String> = client
        .list("/data")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec!["obj".to_string()]);
    for p in ["/data/link", "/data/dirlink/secret"] {
        match client.read(p, 0..100).await {
            Err(Error::NotFound(_)) => {}
            other => panic!("{p}: {other:?}"),
        }
        let out = c.pagectl(&["cat", p]);
        assert!(!out.status.success(), "pagectl cat {p}: {out:?}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("TOP-SECRET"));
    }

    // Cache page 0 of the object, then rewrite the file in place (same inode, same size) and
    // put its mtime back, as `rsync --inplace -t` or `cp -p` do.
    let first = client.read("/data/obj", 0..MIB as u64).await.unwrap();
    assert!(first[..] == v1[..MIB]);
    tokio::time::sleep(Duration::from_millis(300)).await; // the page is kept by now
    let mtime = std::fs::metadata(data.join("obj"))
        .unwrap()
        .modified()
        .unwrap();
    let v2 = bytes(42, 3 * MIB);
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(data.join("obj"))
            .unwrap();
        f.write_all(&v2).unwrap();
        f.set_modified(mtime).unwrap();
    }
    assert_eq!(
        std::fs::metadata(data.join("obj"))
            .unwrap()
            .modified()
            .unwrap(),
        mtime
    );
    // At once (the node may still hold the old metadata): the old version whole, the new
    // version whole, or an error; never old page 0 with new pages 1 and 2.
    match client.read("/data/obj", 0..v1.len() as u64).await {
        Ok(b) => assert!(
            b[..] == v1[..] || b[..] == v2[..],
            "a read spliced two versions of the file"
        ),
        Err(Error::Changed(_)) => {}
        Err(e) => panic!("{e}"),
    }
    // After the metadata TTL (1 s): the new version, whole.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let now = client.read("/data/obj", 0..v2.len() as u64).await.unwrap();
    assert!(now[..] == v2[..], "the new version after the TTL");
}

#[test]
fn a_node_refuses_file_mounts_outside_its_allowed_roots() {
    let home = tempfile::tempdir_in("/var/tmp").unwrap();
    let allowed = home.path().join("allowed");
    std::fs::create_dir_all(&allowed).unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(PAGESTORED)
            .args(args)
            .args(["--no-pin", "--admin", "off"])
            .env("PAGESTORE_HOME", home.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let e = run(&[
        "--mount",
        "/etc=file:///etc",
        "--allow-file-root",
        allowed.to_str().unwrap(),
    ]);
    assert!(e.contains("--allow-file-root") && e.contains("/etc"), "{e}");
    // A symlink beneath an allowed root that leads out of it is refused too.
    symlink("/etc", allowed.join("etc")).unwrap();
    let e = run(&[
        "--mount",
        &format!("/etc=file://{}/etc", allowed.display()),
        "--allow-file-root",
        allowed.to_str().unwrap(),
    ]);
    assert!(e.contains("--allow-file-root"), "{e}");
    // The same from the config file.
    let cfg = home.path().join("roots.toml");
    std::fs::write(
        &cfg,
        format!(
            "allow_file_roots = [\"{}\"]\n[mounts]\n\"/etc\" = \"file:///etc\"\n",
            allowed.display()
        ),
    )
    .unwrap();
    let e = run(&["--config", cfg.to_str().unwrap()]);
    assert!(e.contains("--allow-file-root"), "{e}");
    let e = run(&["--allow-file-root", "/definitely/not/here"]);
    assert!(e.contains("--allow-file-root /definitely/not/here"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_is_an_error_not_a_missing_file_and_not_a_dead_node() {
    // An S3 endpoint that refuses connections, with credentials in its userinfo too.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!(
        "s3://bucket/prefix?endpoint=http://euser:epass@127.0.0.1:{port}\
         &access_key_id=AKIDTEST&secret_access_key=SKEYTEST"
    );
    let (dir, mut s) = common::settings();
    s.mounts = vec![format!("/s3={url}")];
    s.nodes = 1;
    s.shards = 1;
    let c = Cluster::start(dir, s);
    // This client has no S3 credentials of its own.
    std::env::remove_var("AWS_ACCESS_KEY_ID");
    std::env::remove_var("AWS_SECRET_ACCESS_KEY");
    let client = c.client(ClientOptions::default()).await;
    let shown = &client.mounts()[0].url;
    for secret in ["euser", "epass", "AKIDTEST", "SKEYTEST"] {
        assert!(!shown.contains(secret), "{shown}");
    }
    for round in 0..3 {
        let t = Instant::now();
        match client.stat("/s3/some/object").await {
            Err(Error::NotFound(m)) => {
                panic!("round {round}: an unreachable store is not ENOENT: {m}")
            }
            Err(e) => {
                let text = e.to_string();
                assert!(!text.contains("epass"), "{text}");
            }
            Ok(i) => panic!("{i:?}"),
        }
        match client.list("/s3/some").await {
            Err(Error::NotFound(m)) => panic!("round {round}: listing: {m}"),
            Err(_) => {}
            Ok(v) => panic!("{v:?}"),
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    }
    let st = client.stats();
    assert_eq!(
        (st.member_failures, st.skipped_dead),
        (0, 0),
        "the node answered every time: it must not be backed off ({st:?})"
    );
}
