//! Three `pagestored` processes over an S3-protocol under storage (a real S3 server started
//! in-process by the test, serving a directory): byte-exact cold and warm reads with hit
//! counters, listings, and fallback to S3 itself when a worker dies.
#![allow(clippy::unwrap_used)]

mod common;

use std::{sync::Arc, time::Duration};

use common::{bytes, Cluster};
use pagestore_client::{ufs::MountTable, Client, ClientOptions, WriteOptions};
use pagestore_testkit::{sha256_hex, S3Server};

const KEY: &str = "AKIDPAGESTORETEST";
const SECRET: &str = "pagestore-test-secret";
const MIB: usize = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_s3_reads_byte_exact_and_falls_back_to_s3() {
    let root = tempfile::tempdir().unwrap();
    let prefix = root.path().join("training-data").join("set1");
    std::fs::create_dir_all(prefix.join("sub")).unwrap();
    let ps = MIB;
    let sizes = [0, 1, ps - 1, ps, ps + 1, 5 * ps + 3, 12_345, 2 * ps];
    let files: Vec<(String, Vec<u8>)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let name = if i % 3 == 0 {
                format!("sub/f{i}")
            } else {
                format!("f{i}")
            };
            (name, bytes(100 + i as u64, n))
        })
        .collect();
    for (name, b) in &files {
        std::fs::write(prefix.join(name), b).unwrap();
    }
    let s3 = S3Server::start(root.path(), KEY, SECRET).unwrap();
    let url = format!(
        "s3://training-data/set1?endpoint={}&region=us-east-1&access_key_id={KEY}&secret_access_key={SECRET}",
        s3.endpoint()
    );
    let (dir, mut settings) = common::settings();
    settings.mounts = vec![format!("/s3={url}")];
    let mut c = Cluster::start(dir, settings);
    // The cluster hands out its mounts without the credentials.
    let plain = c.client(ClientOptions::default()).await;
    let shown = &plain.mounts()[0].url;
    assert!(!shown.contains(SECRET) && !shown.contains(KEY), "{shown}");
    drop(plain);

    // This client may read S3 itself when a worker is down.
    let ufs = Arc::new(MountTable::new(&[("/s3".to_string(), url.clone())]).unwrap());
    let tls = pagestore_client::tls::client_config(&c.ca_dir).unwrap();
    let client = Client::connect(
        &c.source(),
        tls,
        Some(ufs),
        ClientOptions {
            call_timeout: Duration::from_secs(1),
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();

    let pages: u64 = sizes.iter().map(|&n| n.div_ceil(ps) as u64).sum();
    let (h0, m0) = c.hits_and_misses(&client).await;
    for pass in 0..2 {
        for (name, b) in &files {
            let got = client
                .read(&format!("/s3/{name}"), 0..u64::MAX)
                .await
                .unwrap();
            assert_eq!(sha256_hex(&got), sha256_hex(b), "pass {pass}: {name}");
        }
    }
    let (h1, m1) = c.hits_and_misses(&client).await;
    assert_eq!(
        (h1 - h0, m1 - m0),
        (pages, pages),
        "cold misses, then warm hits"
    );
    assert_eq!(client.stats().fallbacks, 0);

    let mut names: Vec<String> = client
        .list("/s3")
        .await
        .unwrap()
        .into_iter()
        .map(|e| {
            if e.is_dir {
                format!("{}/", e.name)
            } else {
                e.name
            }
        })
        .collect();
    names.sort();
    let mut expected: Vec<String> = files
        .iter()
        .filter(|(n, _)| !n.contains('/'))
        .map(|(n, _)| n.clone())
        .chain(["sub/".to_string()])
        .collect();
    expected.sort();
    assert_eq!(names, expected);
    assert!(matches!(
        client.stat("/s3/absent").await,
        Err(pagestore_client::Error::NotFound(_))
    ));

    // A worker dies: every file still reads byte-exact, partly straight from S3. The worker
    // is one that owns pages of these files (the ring's ports are random: a fixed node may own
    // none of 13 pages, and then nothing falls back).
    let membership = client.membership();
    let mut owned = vec![0usize; c.nodes.len()];
    for (name, _) in &files {
        let info = client.stat(&format!("/s3/{name}")).await.unwrap();
        for page in 0..info.size.div_ceil(ps as u64) {
            let m = membership.ring().owner(info.file_id, page).unwrap();
            owned[c.node_of(membership.addr_of(m).unwrap())] += 1;
        }
    }
    let victim = (1..c.nodes.len()).max_by_key(|&n| owned[n]).unwrap();
    assert!(owned[victim] > 0, "{owned:?}");
    c.inner.kill(victim);
    for (name, b) in &files {
        let got = client
            .read(&format!("/s3/{name}"), 0..u64::MAX)
            .await
            .unwrap();
        assert_eq!(sha256_hex(&got), sha256_hex(b), "after the kill: {name}");
    }
    let s = client.stats();
    assert!(s.fallbacks > 0 && s.ufs_bytes > 0, "{s:?}");
}

/// Write-back over S3: a file larger than a flush part (16 MiB) reaches the store as a
/// multipart upload, which S3 cannot complete conditionally, so the flusher checks just before
/// completing it that the path still names its version and the object is still what it found.
/// Each version, the first and one written over it, is byte-exact in S3 once flushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_back_mount_over_s3_flushes_large_files_as_multipart_uploads() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("ckpt").join("run")).unwrap();
    let s3 = S3Server::start(root.path(), KEY, SECRET).unwrap();
    let url = format!(
        "s3://ckpt/run?endpoint={}&region=us-east-1&access_key_id={KEY}&secret_access_key={SECRET}&write=back",
        s3.endpoint()
    );
    let (dir, mut settings) = common::settings();
    settings.mounts = vec![format!("/ck={url}")];
    let c = Cluster::start(dir, settings);
    let client = c.client(ClientOptions::default()).await;
    for (seed, len) in [(7, 40 * MIB + 5), (8, 17 * MIB)] {
        let data = bytes(seed, len);
        let mut w = client
            .create("/ck/model.bin", WriteOptions::default())
            .await
            .unwrap();
        w.write_at(0, &data).await.unwrap();
        w.close().await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let s = client.write_back_state("/ck").await.unwrap();
            if s.files_dirty == 0 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "not flushed: {s:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let stored = std::fs::read(root.path().join("ckpt/run/model.bin")).unwrap();
        assert_eq!(
            sha256_hex(&stored),
            sha256_hex(&data),
            "version {seed} in S3"
        );
        let got = client.read("/ck/model.bin", 0..u64::MAX).await.unwrap();
        assert_eq!(
            sha256_hex(&got),
            sha256_hex(&data),
            "version {seed} read back"
        );
    }
}
