//! Three real `pagestored` processes on 127.0.0.1 over a local-directory under storage, read
//! through the client library and `pagectl`: byte-exact cold and warm reads, hit counters,
//! mutual TLS, a worker killed mid-read, a rewritten object, unknown paths and short reads, a
//! preload that waits for a late shard.
#![allow(clippy::unwrap_used)]

mod common;

use std::{sync::Arc, time::Duration};

use common::{bytes, Cluster};
use futures_util::{stream, StreamExt};
use pagestore_client::{Client, ClientOptions, ClusterSource, Error};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

const MIB: usize = 1 << 20;

/// A cluster over a data directory filled by `fill` before the nodes start.
fn cluster_with_data(mtls: bool, fill: impl FnOnce(&std::path::Path)) -> Cluster {
    let (dir, mut s) = common::settings();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    fill(&data);
    s.mounts = vec![format!("/data=file://{}", data.display())];
    s.mtls = mtls;
    Cluster::start(dir, s)
}

async fn read_all(client: &Arc<Client>, path: &str) -> Vec<u8> {
    let mut f = client.open(path).await.unwrap();
    let mut out = Vec::new();
    f.read_to_end(&mut out).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_serve_200_files_byte_exact_cold_then_warm_with_mutual_tls() {
    let ps = MIB;
    let mut sizes = vec![0, 1, ps - 1, ps, ps + 1, 100 * MIB + 3];
    let mut x = 7u64;
    while sizes.len() < 200 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        sizes.push((x >> 33) as usize % (5 * ps / 2));
    }
    let files: Vec<(String, Vec<u8>)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| (format!("/data/d{}/f{i:03}", i % 7), bytes(i as u64 + 1, n)))
        .collect();
    let c = cluster_with_data(true, |root| {
        for (p, b) in &files {
            let path = root.join(p.trim_start_matches("/data/"));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, b).unwrap();
        }
    });
    let client = c.client(ClientOptions::default()).await;
    assert_eq!(client.page_size() as usize, ps);

    // A client without a certificate from the cluster CA is refused.
    let no_cert = tempfile::tempdir().unwrap();
    std::fs::copy(
        c.ca_dir.join("ca-cert.pem"),
        no_cert.path().join("ca-cert.pem"),
    )
    .unwrap();
    let tls = pagestore_client::tls::client_config(no_cert.path()).unwrap();
    let refused = Client::connect(
        &ClusterSource::File(c.members.clone()),
        tls,
        None,
        ClientOptions {
            call_timeout: Duration::from_secs(2),
            ..ClientOptions::default()
        },
    )
    .await;
    assert!(
        matches!(refused, Err(Error::Unavailable { .. })),
        "{:?}",
        refused.err()
    );

    let total_pages: u64 = sizes.iter().map(|&n| n.div_ceil(ps) as u64).sum();
    let (h0, m0) = c.hits_and_misses(&client).await;
    for pass in ["cold", "warm"] {
        let results: Vec<(usize, Vec<u8>)> = stream::iter(files.iter().enumerate())
            .map(|(i, (p, _))| {
                let client = client.clone();
                async move { (i, read_all(&client, p).await) }
            })
            .buffer_unordered(8)
            .collect()
            .await;
        for (i, got) in results {
            assert!(
                got == files[i].1,
                "{pass} read of {} ({} bytes) differs",
                files[i].0,
                files[i].1.len()
            );
        }
        let (h, m) = c.hits_and_misses(&client).await;
        if pass == "cold" {
            assert_eq!(h - h0, 0, "nothing was cached before the cold pass");
            assert_eq!(m - m0, total_pages, "every page missed once");
        } else {
            assert_eq!(
                h - h0,
                total_pages,
                "the warm pass hit every page in the cache"
            );
            assert_eq!(m - m0, total_pages, "and missed none");
        }
    }
    let s = client.stats();
    assert_eq!(s.fallbacks, 0, "{s:?}");
    assert_eq!(s.owner_reads, 2 * total_pages, "{s:?}");

    // The same bytes through pagectl, and a listing.
    let out = c.pagectl(&["cat", &files[5].0]);
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout == files[5].1);
    let out = c.pagectl(&["ls", "/data/d0"]);
    assert!(out.status.success(), "{out:?}");
    let listed: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let mut expected: Vec<String> = files
        .iter()
        .filter(|(p, _)| p.starts_with("/data/d0/"))
        .map(|(p, _)| p.rsplit('/').next().unwrap().to_string())
        .collect();
    expected.sort();
    assert_eq!(listed, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_short_reads_and_seeks_behave_like_posix() {
    let ps = MIB;
    let content = bytes(3, 3 * ps + 10);
    let c = cluster_with_data(false, |root| {
        std::fs::create_dir_all(root.join("dir")).unwrap();
        std::fs::write(root.join("dir/file"), &content).unwrap();
        std::fs::write(root.join("dir/text"), "one\ntwo\nthree\n").unwrap();
    });
    let client = c.client(ClientOptions::default()).await;
    assert!(matches!(
        client.stat("/data/nope").await,
        Err(Error::NotFound(p)) if p == "/data/nope"
    ));
    assert!(matches!(
        client.open("/data/dir").await,
        Err(Error::IsDir(_))
    ));
    assert!(matches!(
        client.list("/data/dir/file").await,
        Err(Error::NotDir(_))
    ));
    assert!(matches!(
        client.list("/data/missing").await,
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        client.stat("/data/../etc/passwd").await,
        Err(Error::BadPath(_))
    ));
    assert!(matches!(
        client.stat("relative").await,
        Err(Error::BadPath(_))
    ));
    // Reads past the end are short; at or after the end they are empty.
    let size = content.len() as u64;
    let r = client
        .read("/data/dir/file", size - 10..size + 100)
        .await
        .unwrap();
    assert_eq!(&r[..], &content[content.len() - 10..]);
    assert!(client
        .read("/data/dir/file", size..size + 5)
        .await
        .unwrap()
        .is_empty());
    assert!(client
        .read("/data/dir/file", size + 7..size + 9)
        .await
        .unwrap()
        .is_empty());
    // A range across page boundaries.
    let r = client
        .read("/data/dir/file", ps as u64 - 5..2 * ps as u64 + 5)
        .await
        .unwrap();
    assert!(r[..] == content[ps - 5..2 * ps + 5]);
    // Seeks.
    let mut f = client.open("/data/dir/file").await.unwrap();
    let mut buf = vec![0u8; 100];
    f.seek(std::io::SeekFrom::End(-50)).await.unwrap();
    let mut tail = Vec::new();
    f.read_to_end(&mut tail).await.unwrap();
    assert_eq!(&tail[..], &content[content.len() - 50..]);
    assert_eq!(f.read(&mut buf).await.unwrap(), 0, "EOF");
    f.seek(std::io::SeekFrom::Start(ps as u64 + 3))
        .await
        .unwrap();
    f.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf[..], &content[ps + 3..ps + 103]);
    assert!(f
        .seek(std::io::SeekFrom::Current(-(10 * ps as i64)))
        .await
        .is_err());
    // pagectl: a missing file is an error with the path in it, and exit status 1.
    let out = c.pagectl(&["cat", "/data/nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/data/nope"));
    let out = c.pagectl(&["ls", "/"]);
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "data/\n");
    let out = c.pagectl(&["head", "-n", "2", "/data/dir/text"]);
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "one\ntwo\n");
    let out = c.pagectl(&["stat", "--interval", "0.2"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("cluster: 3 nodes (0 down)"), "{text}");
    assert!(
        text.contains("read bandwidth over the last 0.2 s"),
        "{text}"
    );
    // The counters behind those rates count exactly the bytes served from the caches.
    let hit_bytes = |v: &[(_, u16, Option<pagestore_client::ShardCounters>)]| -> u64 {
        v.iter().map(|(_, _, c)| c.unwrap().hit_bytes).sum()
    };
    client.read("/data/dir/file", 0..u64::MAX).await.unwrap(); // warm every page
    let before = hit_bytes(&client.shard_counters().await);
    let all = client.read("/data/dir/file", 0..u64::MAX).await.unwrap();
    let after = hit_bytes(&client.shard_counters().await);
    assert_eq!(after - before, all.len() as u64);
    let out = c.pagectl(&["ring"]);
    let text = String::from_utf8(out.stdout).unwrap();
    let node_shares: f64 = text
        .lines()
        .filter(|l| !l.starts_with(' ') && l.ends_with('%'))
        .map(|l| {
            l.rsplit(' ')
                .next()
                .unwrap()
                .trim_end_matches('%')
                .parse::<f64>()
                .unwrap()
        })
        .sum();
    assert!((node_shares - 100.0).abs() < 0.1, "{text}");
    // Any member's address works instead of the member file.
    let out = std::process::Command::new(common::PAGECTL)
        .arg("--cluster")
        .arg(c.nodes[1].base.to_string())
        .arg("--tls-dir")
        .arg(&c.ca_dir)
        .args(["cat", "/data/dir/file"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout == content);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_whose_member_dies_midway_goes_on_from_where_it_stopped() {
    // More entries than three pages of a listing.
    let n = pagestore_protocol::frame::MAX_LIST_ENTRIES * 2 + 500;
    let names: Vec<String> = (0..n).map(|i| format!("f{i:05}")).collect();
    let mut c = cluster_with_data(false, |root| {
        std::fs::create_dir_all(root.join("big")).unwrap();
        for name in &names {
            std::fs::write(root.join("big").join(name), b"x").unwrap();
        }
    });
    let client = c
        .client(ClientOptions {
            call_timeout: Duration::from_secs(1),
            ..ClientOptions::default()
        })
        .await;
    let owner = metadata_node(&c, &client, "/data/big");
    let before = client.stats();
    let (mut got, mut pages) = (Vec::new(), 0);
    client
        .list_pages("/data/big", |page| {
            pages += 1;
            got.extend(page.iter().map(|e| e.name.clone()));
            if pages == 1 {
                // The member answering the listing dies after its first page.
                assert!(page.len() < n, "the first page is not the whole listing");
                c.inner.kill(owner);
            }
        })
        .await
        .unwrap();
    // The rest came from the under storage, from where the member stopped: every entry once,
    // in order.
    assert!(pages >= 2, "{pages} pages");
    assert_eq!(got, names);
    let s = client.stats();
    assert_eq!(s.metadata_fallbacks - before.metadata_fallbacks, 1, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_read_costs_speed_not_correctness() {
    let content = bytes(11, 120 * MIB + 17);
    let mut c = cluster_with_data(false, |root| {
        std::fs::write(root.join("long"), &content).unwrap();
    });
    let client = c
        .client(ClientOptions {
            call_timeout: Duration::from_secs(1),
            ..ClientOptions::default()
        })
        .await;
    let mut f = client.open("/data/long").await.unwrap();
    let mut got = Vec::with_capacity(content.len());
    let mut buf = vec![0u8; 256 << 10];
    let mut killed = false;
    loop {
        let n = f.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if !killed && got.len() > 30 * MIB {
            c.inner.kill(1);
            killed = true;
        }
    }
    assert!(got == content, "the read completed byte-exact");
    let s = client.stats();
    assert!(s.fallbacks > 0, "{s:?}");
    assert!(s.member_failures > 0, "{s:?}");
    // Once known dead, the member is skipped rather than waited for on every page.
    assert!(s.skipped_dead > 0, "{s:?}");
    assert!(
        s.member_failures < s.fallbacks,
        "back-off: fewer timeouts than fallbacks ({s:?})"
    );

    // With fallback off, a page owned by the dead node is an error, not a hang.
    let strict = c
        .client(ClientOptions {
            fallback: false,
            call_timeout: Duration::from_secs(1),
            ..ClientOptions::default()
        })
        .await;
    let info = strict.stat("/data/long").await;
    // The metadata owner may be the dead node: then stat fails too, which is also correct.
    if let Ok(info) = info {
        let r = strict.read_at(&info, 0, info.size).await;
        assert!(
            matches!(r, Err(Error::Unavailable { .. })),
            "{:?}",
            r.map(|b| b.len())
        );
    }

    // The node comes back with its cache: its pages are hits again.
    c.start_node(1);
    let again = c.client(ClientOptions::default()).await;
    let (h0, _) = c.hits_and_misses(&again).await;
    let all = again
        .read("/data/long", 0..content.len() as u64)
        .await
        .unwrap();
    assert!(all[..] == content[..]);
    let (h1, _) = c.hits_and_misses(&again).await;
    assert!(h1 > h0, "restarted node served from its cache");
    assert_eq!(again.stats().fallbacks, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_is_left_when_it_goes_silent_not_after_the_call_timeout() {
    let content = bytes(12, 24 * MIB + 5);
    let mut c = cluster_with_data(false, |root| {
        std::fs::write(root.join("f"), &content).unwrap();
    });
    // Only the silence rule can end the requests that wait on the killed node. (The rule
    // scales with the answer times the client saw: on a loaded machine it waits longer, so the
    // bound below is loose.)
    let (client, call_timeout) = patient_reader(&c, &content).await;
    // Every member has answered: the client knows their usual answer times.
    let (took, s) = kill_then_read_f(&mut c, &client, 1, &content).await;
    let t = std::time::Instant::now();
    // Its requests were hedged to the store (or, past the hedge budget, given up).
    assert!(s.hedges_won + s.silent_gives_up >= 1, "{s:?}");
    assert!(s.fallbacks > 0, "{s:?}");
    assert!(
        took < call_timeout / 2,
        "the dead node was waited for as if it might answer: {took:?} ({s:?})"
    );
    // The silence rule gives it up (in the background for the requests a hedge answered), and
    // it is skipped from then on.
    while client.stats().silent_gives_up == 0 {
        assert!(t.elapsed() < call_timeout / 2, "{:?}", client.stats());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(read_all(&client, "/data/f").await == content);
    assert!(client.stats().skipped_dead > 0, "{:?}", client.stats());
}

/// A client whose call timeout (returned) is far longer than a test may take, after it read
/// `/data/f` (`content`) whole once: every member has answered it, so it knows their usual
/// answer times.
async fn patient_reader(c: &Cluster, content: &[u8]) -> (Arc<Client>, Duration) {
    let call_timeout = Duration::from_secs(60);
    let client = c
        .client(ClientOptions {
            call_timeout,
            ..ClientOptions::default()
        })
        .await;
    assert!(read_all(&client, "/data/f").await == content);
    (client, call_timeout)
}

/// SIGKILLs node `victim`, then reads `/data/f` whole (it must be `content`): how long the read
/// took, and the client's stats after it.
async fn kill_then_read_f(
    c: &mut Cluster,
    client: &Client,
    victim: usize,
    content: &[u8],
) -> (Duration, pagestore_client::StatsSnapshot) {
    c.inner.kill(victim);
    let t = std::time::Instant::now();
    let all = client
        .read("/data/f", 0..content.len() as u64)
        .await
        .unwrap();
    let took = t.elapsed();
    assert!(all[..] == content[..], "byte-exact after the kill");
    (took, client.stats())
}

/// A one-node cluster over a local directory mounted at `/data` that holds `f` (`content`).
fn lone_node_with_f(content: &[u8]) -> Cluster {
    let (dir, mut s) = common::settings();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("f"), content).unwrap();
    s.mounts = vec![format!("/data=file://{}", data.display())];
    s.nodes = 1;
    Cluster::start(dir, s)
}

/// A one-node cluster whose node is SIGKILLed: no member of another node can answer a control
/// ping, so silence alone would be waited on for the call timeout (a lone node that is only
/// busy must not be backed off, see `writeback.rs`); but the node's host refuses datagrams to
/// its port, which tells a process that is gone from one that is stopped, and the client reads
/// the store at once. A SIGSTOPped node keeps its socket: it is not taken for gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_node_that_is_killed_is_left_at_once_but_a_stopped_one_is_waited_for() {
    let content = bytes(14, 3 * MIB + 7);
    let mut c = lone_node_with_f(&content);
    // Only telling the node gone can end the requests that wait on it.
    let (client, _) = patient_reader(&c, &content).await;

    // Stopped for a second: waited for, not taken for gone.
    c.signal(0, libc::SIGSTOP).unwrap();
    let read = tokio::spawn({
        let client = client.clone();
        async move { read_all(&client, "/data/f").await }
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    c.signal(0, libc::SIGCONT).unwrap();
    assert!(read.await.unwrap() == content);
    let s = client.stats();
    assert_eq!(s.ports_refused, 0, "{s:?}");
    assert_eq!(s.fallbacks, 0, "{s:?}");

    let (took, s) = kill_then_read_f(&mut c, &client, 0, &content).await;
    assert!(s.ports_refused >= 1, "{s:?}");
    assert!(s.fallbacks >= 1, "{s:?}");
    // Generous for a loaded machine (the benchmark has the tight figure): without the probe
    // this waits for the call timeout.
    assert!(
        took < Duration::from_secs(10),
        "the dead node was waited for as if it might answer: {took:?} ({s:?})"
    );
}

/// A client that has had no answer from any member yet (a process just started, such as a
/// data-loader worker) has no answer times to judge silence by, so it gives a request the call
/// timeout; but a node that was SIGKILLed is told by its port all the same, and the client
/// reads the store at once instead of waiting out that timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_client_does_not_wait_out_its_call_timeout_on_a_killed_node() {
    let content = bytes(15, 2 * MIB + 3);
    let mut c = lone_node_with_f(&content);
    // Connected (the membership is asked outside the requests' timing), nothing asked yet.
    let client = c
        .client(ClientOptions {
            call_timeout: Duration::from_secs(60),
            ..ClientOptions::default()
        })
        .await;
    let (took, s) = kill_then_read_f(&mut c, &client, 0, &content).await;
    assert!(s.ports_refused >= 1, "{s:?}");
    assert!(s.fallbacks + s.metadata_fallbacks >= 1, "{s:?}");
    // Generous for a loaded machine: without the probe this waits for the call timeout.
    assert!(
        took < Duration::from_secs(10),
        "the dead node was waited for as if it might answer: {took:?} ({s:?})"
    );
}

/// A client that has had no answer from any member yet has no answer times of its own to
/// judge silence by, and a node whose host is gone as a whole (or whose network drops
/// datagrams without a word) refuses nothing: a stopped node stands for both here (its socket
/// takes the datagrams, nothing answers, no port is refused). The client asks a member of
/// another node for a ping, and once it answers, judges the silent one by that: a fresh
/// client's stat and read are answered (from the store) well within its call timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_client_does_not_wait_out_its_call_timeout_on_a_node_that_answers_nothing() {
    let content = bytes(16, 5 * MIB + 11);
    let c = cluster_with_data(false, |root| {
        std::fs::write(root.join("f"), &content).unwrap();
        for i in 0..12 {
            std::fs::write(root.join(format!("m{i}")), vec![i as u8; i + 1]).unwrap();
        }
    });
    let call_timeout = Duration::from_secs(60);
    let fresh = || {
        c.client(ClientOptions {
            call_timeout,
            ..ClientOptions::default()
        })
    };
    // Connected (the membership is asked outside the requests' timing), nothing asked yet.
    let (stats, reads) = (fresh().await, fresh().await);
    let stopped = 1;
    let (i, path) = (0..12)
        .map(|i| (i, format!("/data/m{i}")))
        .find(|(_, p)| metadata_node(&c, &stats, p) == stopped)
        .expect("a path whose metadata node 1 owns");
    c.signal(stopped, libc::SIGSTOP).unwrap();

    let t = std::time::Instant::now();
    let size = stats.stat(&path).await.map(|info| info.size);
    let took = t.elapsed();
    let s = stats.stats();
    assert_eq!(size.unwrap(), i as u64 + 1, "{s:?}");
    assert_eq!(
        s.ports_refused, 0,
        "a stopped node is not taken for gone: {s:?}"
    );
    assert_eq!(s.metadata_fallbacks, 1, "{s:?}");
    // Generous for a loaded machine (under a second here): without a ping to another node
    // this waits for the call timeout, or for the 10 s after which QUIC gives up a handshake
    // that nothing answers.
    assert!(
        took < Duration::from_secs(5),
        "the silent node was waited for as if no member could be compared with: {took:?} \
         ({s:?})"
    );

    // A whole file, some of whose pages the stopped node owns: byte-exact, as soon.
    let t = std::time::Instant::now();
    let got = read_all(&reads, "/data/f").await;
    let took = t.elapsed();
    let s = reads.stats();
    assert!(got == content, "byte-exact around the stopped node");
    assert!(s.fallbacks + s.metadata_fallbacks >= 1, "{s:?}");
    assert!(took < Duration::from_secs(5), "{took:?} ({s:?})");
    c.signal(stopped, libc::SIGCONT).unwrap();
}

/// The index of the node that owns page `page` of `info` under `client`'s ring.
fn owner_node(
    c: &Cluster,
    client: &Client,
    info: &pagestore_client::ufs::ObjectInfo,
    page: u64,
) -> usize {
    let membership = client.membership();
    let m = membership.ring().owner(info.file_id, page).unwrap();
    c.node_of(membership.addr_of(m).unwrap())
}

/// The index of the node that owns the metadata of `path` under `client`'s ring.
fn metadata_node(c: &Cluster, client: &Client, path: &str) -> usize {
    let membership = client.membership();
    let hash = pagestore_protocol::ring::path_hash(path);
    let m = membership.ring().owner_of_hash(hash).unwrap();
    c.node_of(membership.addr_of(m).unwrap())
}

/// Every shard's store reads, summed over the running nodes among `which`.
async fn store_reads(client: &Client, c: &Cluster, which: &[usize]) -> u64 {
    let bases: Vec<std::net::SocketAddr> = which.iter().map(|&i| c.nodes[i].base).collect();
    client
        .shard_counters()
        .await
        .into_iter()
        .filter(|(n, _, _)| bases.contains(&n.addr))
        .map(|(_, _, s)| s.expect("every running shard answers").ufs_reads)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_or_killed_node_is_hedged_around_before_the_silence_rule_gives_it_up() {
    let content = bytes(13, 24 * MIB + 9);
    let mut c = cluster_with_data(false, |root| {
        std::fs::write(root.join("f"), &content).unwrap();
        for i in 0..12 {
            std::fs::write(root.join(format!("m{i}")), vec![i as u8; i + 1]).unwrap();
        }
    });
    // A call timeout far longer than the test may take: only a hedge or the silence rule can
    // end a request that waits on a stalled node. A budget that does not run out here (the
    // budget has its own test below).
    let call_timeout = Duration::from_secs(60);
    let client = c
        .client(ClientOptions {
            call_timeout,
            hedge_burst: 1000,
            ..ClientOptions::default()
        })
        .await;
    assert!(read_all(&client, "/data/f").await == content);
    let info = client.stat("/data/f").await.unwrap();
    let pages = info.size.div_ceil(u64::from(client.page_size()));
    let page_bytes = |p: u64| {
        let ps = client.page_size() as usize;
        &content[p as usize * ps..((p as usize + 1) * ps).min(content.len())]
    };
    let of_node = |n: usize| (0..pages).find(|&p| owner_node(&c, &client, &info, p) == n);

    // Stalled (SIGSTOP): its socket takes the request, nothing answers, not even a ping. The
    // read is hedged to the under storage and answered from it, well before the silence rule
    // (4 times the usual answer time and a missed ping) would give the request up.
    let stalled = 1;
    let p = of_node(stalled).expect("a page of node 1");
    c.signal(stalled, libc::SIGSTOP).unwrap();
    let before = client.stats();
    let t = std::time::Instant::now();
    let got = client
        .read_page(&info, p, 0, client.page_size())
        .await
        .unwrap();
    let took = t.elapsed();
    assert!(got[..] == page_bytes(p)[..], "byte-exact from the hedge");
    let s = client.stats();
    assert_eq!(s.hedges - before.hedges, 1, "{s:?}");
    assert_eq!(s.store_hedges - before.store_hedges, 1, "{s:?}");
    assert_eq!(s.hedges_won - before.hedges_won, 1, "{s:?}");
    assert_eq!(
        s.silent_gives_up, before.silent_gives_up,
        "the hedge came first: {s:?}"
    );
    // Generous for a loaded CI machine; the benchmark has the tight figures.
    assert!(took < Duration::from_secs(5), "{took:?} ({s:?})");
    // A stat whose metadata owner is the stalled node: hedged to the store as well.
    let (i, path) = (0..12)
        .map(|i| (i, format!("/data/m{i}")))
        .find(|(_, p)| metadata_node(&c, &client, p) == stalled)
        .expect("a path whose metadata node 1 owns");
    let before_stat = client.stats();
    let t = std::time::Instant::now();
    assert_eq!(client.stat(&path).await.unwrap().size, i as u64 + 1);
    let took = t.elapsed();
    let s = client.stats();
    assert_eq!(s.hedges_won - before_stat.hedges_won, 1, "{s:?}");
    assert_eq!(
        s.metadata_fallbacks - before_stat.metadata_fallbacks,
        1,
        "{s:?}"
    );
    assert!(took < Duration::from_secs(5), "{took:?} ({s:?})");
    // The whole file meanwhile: byte-exact.
    assert!(read_all(&client, "/data/f").await == content);
    // The cancelled request's member is still settled by the silence rule in the background:
    // given up and backed off, then skipped without waiting.
    let t = std::time::Instant::now();
    while client.stats().silent_gives_up == before.silent_gives_up {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{:?}",
            client.stats()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(read_all(&client, "/data/f").await == content);
    assert!(client.stats().skipped_dead > before.skipped_dead);
    c.signal(stalled, libc::SIGCONT).unwrap();

    // Killed (SIGKILL) while idle: the same.
    let killed = 2;
    let p = of_node(killed).expect("a page of node 2");
    c.inner.kill(killed);
    let before = client.stats();
    let t = std::time::Instant::now();
    let got = client
        .read_page(&info, p, 0, client.page_size())
        .await
        .unwrap();
    let took = t.elapsed();
    assert!(got[..] == page_bytes(p)[..]);
    let s = client.stats();
    assert_eq!(s.hedges_won - before.hedges_won, 1, "{s:?}");
    assert!(took < Duration::from_secs(5), "{took:?} ({s:?})");
    assert!(read_all(&client, "/data/f").await == content);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedges_to_the_store_stay_within_the_budget_for_cold_pages_of_a_stalled_node() {
    let content = bytes(14, 40 * MIB + 1);
    let (dir, mut s) = common::settings();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("warm"), bytes(15, 6 * MIB)).unwrap();
    std::fs::write(data.join("cold"), &content).unwrap();
    // A distant store: every request waits 30 ms.
    s.mounts = vec![format!(
        "/data=file://{}?emulate_latency_ms=30",
        data.display()
    )];
    let c = Cluster::start(dir, s);
    let (ratio, burst) = (0.05, 2);
    let client = c
        .client(ClientOptions {
            call_timeout: Duration::from_secs(60),
            hedge_ratio: ratio,
            hedge_burst: burst,
            ..ClientOptions::default()
        })
        .await;
    // Every member answers once (the client learns their answer times).
    read_all(&client, "/data/warm").await;
    let info = client.stat("/data/cold").await.unwrap();
    let pages = info.size.div_ceil(u64::from(client.page_size()));
    let stalled = (1..3)
        .find(|&n| (0..pages).any(|p| owner_node(&c, &client, &info, p) == n))
        .unwrap();
    let theirs = (0..pages)
        .filter(|&p| owner_node(&c, &client, &info, p) == stalled)
        .count() as u64;
    let live: Vec<usize> = (0..3).filter(|&n| n != stalled).collect();
    let live_before = store_reads(&client, &c, &live).await;
    let before = client.stats();
    c.signal(stalled, libc::SIGSTOP).unwrap();
    assert!(
        read_all(&client, "/data/cold").await == content,
        "byte-exact"
    );
    let s = client.stats();
    let requests = s.owner_reads + s.fallbacks - before.owner_reads - before.fallbacks;
    // Hedges to the store: never more than the bucket held plus its share of the requests.
    let allowed = u64::from(burst) + (ratio * requests as f64).ceil() as u64;
    let store_hedges = s.store_hedges - before.store_hedges;
    assert!(store_hedges >= 1, "{s:?}");
    assert!(
        store_hedges <= allowed,
        "{store_hedges} > {allowed} ({s:?})"
    );
    // Every page was read from the store once: by its live owner, or by this client (a hedge
    // or a fallback) for the stalled node's pages; a second time only for a hedge (a live
    // owner that missed a ping on a loaded machine), within the budget.
    let live_reads = store_reads(&client, &c, &live).await - live_before;
    let client_reads = s.fallbacks - before.fallbacks;
    assert!(client_reads >= theirs, "{client_reads} < {theirs} ({s:?})");
    assert!(
        (pages..=pages + store_hedges).contains(&(live_reads + client_reads)),
        "{live_reads} + {client_reads} store reads for {pages} pages ({s:?})"
    );
    c.signal(stalled, libc::SIGCONT).unwrap();
}

/// A preload (`Client::load`, `LoadPages`) waits for a shard that answers late, within the
/// store's allowance: a shard busy loading (here: stopped for 1.5 s, longer than the silence
/// rule allows a read) is not given up, and the load completes once it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preload_waits_for_a_late_shard_instead_of_failing() {
    let content = bytes(16, 9 * MIB + 7);
    let c = cluster_with_data(false, |d| {
        std::fs::write(d.join("warm"), bytes(17, 6 * MIB)).unwrap();
        std::fs::write(d.join("big"), &content).unwrap();
    });
    let client = c.client(ClientOptions::default()).await;
    // Every member answers once (the client learns their answer times).
    read_all(&client, "/data/warm").await;
    let info = client.stat("/data/big").await.unwrap();
    let pages = info.size.div_ceil(u64::from(client.page_size()));
    let late = owner_node(&c, &client, &info, 0);
    c.signal(late, libc::SIGSTOP).unwrap();
    let load = {
        let (client, info) = (client.clone(), info.clone());
        tokio::spawn(async move { client.load(&info).await })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    c.signal(late, libc::SIGCONT).unwrap();
    let out = load
        .await
        .unwrap()
        .expect("the load waits for the late shard");
    assert_eq!(out.loaded + out.present, pages, "{out:?}");
    assert_eq!(out.loaded, pages, "nothing was cached before: {out:?}");
    let before = client.stats();
    assert!(
        read_all(&client, "/data/big").await == content,
        "byte-exact"
    );
    let s = client.stats();
    // Every page from the cluster, but for a store hedge that won its race (a node just resumed
    // may answer late on a loaded machine; the hedge is counted as a fallback too).
    assert!(
        s.fallbacks - before.fallbacks <= s.hedges_won - before.hedges_won,
        "a page was not served by the cluster: {s:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewritten_object_is_read_new_after_the_ttl_and_never_mixed() {
    let v1 = bytes(21, 3 * MIB);
    let v2 = bytes(22, 3 * MIB);
    let c = cluster_with_data(false, |root| {
        std::fs::write(root.join("obj"), &v1).unwrap();
    });
    let root = c.dir.path().join("data");
    let client = c.client(ClientOptions::default()).await;
    let mut old = client.open("/data/obj").await.unwrap();
    let mut first = vec![0u8; MIB];
    old.read_exact(&mut first).await.unwrap();
    assert!(first[..] == v1[..MIB]);

    std::fs::write(root.join("obj"), &v2).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await; // metadata TTL is 1 s
    let now = client.read("/data/obj", 0..v2.len() as u64).await.unwrap();
    assert!(
        now[..] == v2[..],
        "new readers see the new version after the TTL"
    );

    // The handle opened before the rewrite never mixes versions: its uncached pages can no
    // longer be read at its version, so it fails instead.
    let mut rest = Vec::new();
    match old.read_to_end(&mut rest).await {
        Ok(_) => assert!(rest[..] == v1[MIB..], "old handle mixed versions"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::StaleNetworkFileHandle, "{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_node_cleanly_and_its_cache_survives() {
    let content = bytes(31, 8 * MIB);
    let mut c = cluster_with_data(false, |root| {
        std::fs::write(root.join("f"), &content).unwrap();
    });
    let client = c.client(ClientOptions::default()).await;
    assert!(client.read("/data/f", 0..u64::MAX).await.unwrap()[..] == content[..]);
    for i in 0..3 {
        assert!(c.terminate(i).success(), "node {i} exits 0 on SIGTERM");
    }
    for i in 0..3 {
        c.start_node(i);
    }
    let client = c.client(ClientOptions::default()).await;
    let (h0, m0) = c.hits_and_misses(&client).await;
    assert!(client.read("/data/f", 0..u64::MAX).await.unwrap()[..] == content[..]);
    let (h1, m1) = c.hits_and_misses(&client).await;
    assert_eq!(
        (h1 - h0, m1 - m0),
        (8, 0),
        "all 8 pages hit after the restart"
    );

    // The admin endpoints agree with the shards.
    use pagestore_testkit::local_cluster::http_get;
    let mut hits = 0u64;
    for n in &c.nodes {
        let base = n.admin.as_deref().unwrap();
        let (code, body) = http_get(base, "/health").unwrap();
        assert_eq!(code, 200, "{body}");
        let (code, metrics) = http_get(base, "/metrics").unwrap();
        assert_eq!(code, 200);
        for line in metrics
            .lines()
            .filter(|l| l.starts_with("pagestore_hits_total{"))
        {
            hits += line.rsplit(' ').next().unwrap().parse::<u64>().unwrap();
        }
        assert!(metrics.contains("pagestore_byte_hit_ratio{"), "{metrics}");
        assert!(
            metrics.contains("pagestore_request_latency_microseconds_bucket{le=\"+Inf\""),
            "{metrics}"
        );
        assert!(metrics.ends_with("# EOF\n"), "{metrics}");
        let (code, ring) = http_get(base, "/v1/ring").unwrap();
        assert_eq!(code, 200);
        assert!(ring.contains("\"epoch\":1"), "{ring}");
        assert_eq!(http_get(base, "/nope").unwrap().0, 404);
    }
    assert_eq!(hits, h1, "/metrics counts the same hits as Stat");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_through_the_client_is_read_back_at_once_despite_the_ttl() {
    let (dir, mut s) = common::settings();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("obj"), bytes(41, 2 * MIB + 5)).unwrap();
    let mount = format!("/data=file://{}", data.display());
    s.mounts = vec![mount.clone()];
    s.metadata_ttl = "600".into();
    let c = Cluster::start(dir, s);
    let ufs = Arc::new(
        pagestore_client::ufs::MountTable::new(&[
            pagestore_client::ufs::parse_mount(&mount).unwrap()
        ])
        .unwrap(),
    );
    let tls = pagestore_client::tls::client_config(&c.ca_dir).unwrap();
    let client = Client::connect(&c.source(), tls, Some(ufs), ClientOptions::default())
        .await
        .unwrap();
    // Cache the old version (metadata and pages).
    let old = client.read("/data/obj", 0..u64::MAX).await.unwrap();
    assert_eq!(old.len(), 2 * MIB + 5);
    let new = bytes(42, MIB + 77);
    let info = client.put("/data/obj", new.clone().into()).await.unwrap();
    assert_eq!(info.size, new.len() as u64);
    // Within the 600 s TTL, yet the new bytes: the write invalidated the cached metadata.
    let got = client.read("/data/obj", 0..u64::MAX).await.unwrap();
    assert!(got[..] == new[..]);
    // A new object shows up in its directory's listing at once, and a deleted one goes.
    client
        .put("/data/fresh", vec![7u8; 10].into())
        .await
        .unwrap();
    let names: Vec<String> = client
        .list("/data")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["fresh", "obj"]);
    client.delete("/data/fresh").await.unwrap();
    assert!(matches!(
        client.stat("/data/fresh").await,
        Err(Error::NotFound(_))
    ));
    // A client without a mount table (fallback off: none is built) cannot write.
    let reader = c
        .client(ClientOptions {
            fallback: false,
            ..ClientOptions::default()
        })
        .await;
    assert!(matches!(
        reader.put("/data/x", vec![1u8].into()).await,
        Err(Error::Config { .. })
    ));
}

/// Path metadata requests the nodes answered (from their cache or the store): stats and
/// listing pages, summed over every node's `/metrics`.
fn metadata_requests(c: &Cluster) -> u64 {
    common::metric_total(c, "pagestore_metadata_cache_hits_total")
        + common::metric_total(c, "pagestore_metadata_cache_misses_total")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_over_many_small_files_ask_one_listing_per_directory_not_a_stat_per_file() {
    let (dir, mut s) = common::settings();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("many/a")).unwrap();
    std::fs::create_dir_all(data.join("many/b")).unwrap();
    let mut files: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| (format!("many/a/{i:03}"), bytes(i, 1000 + i as usize)))
        .collect();
    files.extend((0..3).map(|i| (format!("many/b/{i}"), bytes(100 + i, 10))));
    for (n, b) in &files {
        std::fs::write(data.join(n), b).unwrap();
    }
    // A local manifest: the 40 files of many/a (one listing) and the 3 of many/b (fewer than
    // LIST_FROM: a stat each).
    let manifest = dir.path().join("manifest.txt");
    let text: String = files.iter().map(|(n, _)| format!("/data/{n}\n")).collect();
    std::fs::write(&manifest, text).unwrap();
    const { assert!(pagestore_tools::load::LIST_FROM <= 40 && pagestore_tools::load::LIST_FROM > 3) };
    s.mounts = vec![format!("/data=file://{}", data.display())];
    let c = Cluster::start(dir, s);

    let m0 = metadata_requests(&c);
    let out = c.pagectl(&["load", "--manifest", manifest.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("loaded 43 pages"), "{text}");
    assert!(text.contains("0 of 43 files failed"), "{text}");
    let m1 = metadata_requests(&c);
    assert!(
        m1 - m0 <= 1 + 3,
        "one listing and three stats for 43 files, not {}",
        m1 - m0
    );

    // A prefix: the listings of many, many/a and many/b, and no stat.
    let out = c.pagectl(&["load", "--prefix", "/data/many"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("43 pages were cached already"), "{text}");
    let m2 = metadata_requests(&c);
    assert!(m2 - m1 <= 3, "three listings for 43 files, not {}", m2 - m1);

    // What was loaded from the listings is what readers read: every page a hit.
    let client = c.client(ClientOptions::default()).await;
    let (h0, m_0) = c.hits_and_misses(&client).await;
    for (n, b) in &files {
        let got = client
            .read(&format!("/data/{n}"), 0..u64::MAX)
            .await
            .unwrap();
        assert!(got[..] == b[..], "{n}");
    }
    let (h1, m_1) = c.hits_and_misses(&client).await;
    assert_eq!((h1 - h0, m_1 - m_0), (43, 0), "every page was preloaded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_manifest_loads_as_its_directory_is_listed_each_file_once() {
    use pagestore_tools::load::{HEAD_START, HEAD_START_FROM};
    // The head's stats alone never make a node list their directory.
    const { assert!((HEAD_START as u32) < pagestore_server::loader::LIST_AFTER_STATS) };
    let (dir, mut s) = common::settings();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("big")).unwrap();
    let n = HEAD_START_FROM + 200;
    let files: Vec<(String, Vec<u8>)> = (0..n)
        .map(|i| (format!("big/{i:05}"), bytes(20_000 + i as u64, 1 + i % 300)))
        .collect();
    for (name, b) in &files {
        std::fs::write(data.join(name), b).unwrap();
    }
    // Every file (the first HEAD_START stat'ed at once, the rest from the listing as its pages
    // come), and one the directory does not hold.
    let manifest = dir.path().join("manifest.txt");
    let mut text: String = files.iter().map(|(f, _)| format!("/data/{f}\n")).collect();
    text.push_str("/data/big/missing\n");
    std::fs::write(&manifest, text).unwrap();
    s.mounts = vec![format!("/data=file://{}", data.display())];
    // Small pages, so that every file's page stays cached (1,200 pages of 1 MiB would not).
    s.page_size = "64K".into();
    let c = Cluster::start(dir, s);

    let m0 = metadata_requests(&c);
    let out = c.pagectl(&["load", "--manifest", manifest.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "a missing file fails the job: {text}{err}"
    );
    assert!(text.contains(&format!("loaded {n} pages")), "{text}");
    assert!(
        text.contains(&format!("1 of {} files failed", n + 1)),
        "{text}"
    );
    assert!(text.contains("time to first page 0."), "{text}");
    assert!(err.contains("/data/big/missing"), "{err}");
    // The head's stats, the listing's pages (a few hundred entries each) and the missing
    // file's stat: not a stat per file.
    let m1 = metadata_requests(&c);
    assert!(
        m1 - m0 <= HEAD_START as u64 + 8,
        "{} metadata requests for {n} files",
        m1 - m0
    );

    // Loaded once each, and what readers read.
    let client = c.client(ClientOptions::default()).await;
    let (h0, m_0) = c.hits_and_misses(&client).await;
    let sample: Vec<_> = files.iter().step_by(37).collect();
    for (name, b) in &sample {
        let got = client
            .read(&format!("/data/{name}"), 0..u64::MAX)
            .await
            .unwrap();
        assert!(got[..] == b[..], "{name}");
    }
    let (h1, m_1) = c.hits_and_misses(&client).await;
    assert_eq!((h1 - h0, m_1 - m_0), (sample.len() as u64, 0));

    // With --verify the files go one by one, as they are resolved, each compared with the store.
    let out = c.pagectl(&["load", "--manifest", manifest.to_str().unwrap(), "--verify"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains(&format!("{n} pages were cached already")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "verify: {n} pages compared with the under storage; 0 files repaired"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("1 of {} files failed", n + 1)),
        "{text}"
    );
}

/// Requests served by every shard of every node so far (`pagestore_requests_total`).
fn requests_served(c: &Cluster) -> u64 {
    use pagestore_testkit::local_cluster::http_get;
    let mut n = 0;
    for node in &c.nodes {
        let (_, metrics) = http_get(node.admin.as_deref().unwrap(), "/metrics").unwrap();
        for line in metrics
            .lines()
            .filter(|l| l.starts_with("pagestore_requests_total"))
        {
            n += line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64;
        }
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_over_many_small_files_sends_few_requests_and_reports_each_failed_file() {
    let (dir, mut s) = common::settings();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("tiny")).unwrap();
    let files: Vec<(String, Vec<u8>)> = (0..300)
        .map(|i| {
            (
                format!("tiny/f{i:03}"),
                bytes(7000 + i, 100 + 10 * i as usize),
            )
        })
        .collect();
    for (n, b) in &files {
        std::fs::write(data.join(n), b).unwrap();
    }
    s.mounts = vec![format!("/data=file://{}", data.display())];
    s.metadata_ttl = "600".into();
    let c = Cluster::start(dir, s);
    // The directory's listing is cached by its metadata owner; then one file disappears from
    // the store behind the cache's back: the job still names it (from that listing), and
    // its load fails on its own.
    let out = c.pagectl(&["ls", "/data/tiny"]);
    assert!(out.status.success(), "{out:?}");
    let gone = "tiny/f150";
    std::fs::remove_file(c.dir.path().join("data").join(gone)).unwrap();

    let r0 = requests_served(&c);
    let out = c.pagectl(&["load", "--prefix", "/data/tiny"]);
    let r1 = requests_served(&c);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(!out.status.success(), "a failed file fails the job: {text}");
    assert!(text.contains("loaded 299 pages"), "{text}");
    assert!(text.contains("1 of 300 files failed"), "{text}");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        err.contains(&format!("/data/{gone}")),
        "the failed file is named: {err}"
    );
    // A load request names many files: with 3 nodes x 2 shards, a handful of requests per
    // shard (and the listing, the cluster's layout, the job's records), not one per file.
    assert!(
        r1 - r0 <= 60,
        "{} requests for 300 files: not batched",
        r1 - r0
    );

    // What was loaded is what readers read: every page a hit.
    let client = c.client(ClientOptions::default()).await;
    let (h0, m0) = c.hits_and_misses(&client).await;
    for (n, b) in files.iter().filter(|(n, _)| n != gone) {
        let got = client
            .read(&format!("/data/{n}"), 0..u64::MAX)
            .await
            .unwrap();
        assert!(got[..] == b[..], "{n}");
    }
    let (h1, m1) = c.hits_and_misses(&client).await;
    assert_eq!((h1 - h0, m1 - m0), (299, 0), "every page was preloaded");

    // Again: every page is cached already, still in few requests.
    let r2 = requests_served(&c);
    let out = c.pagectl(&["load", "--prefix", "/data/tiny"]);
    let r3 = requests_served(&c);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("299 pages were cached already"), "{text}");
    assert!(r3 - r2 <= 60, "{} requests for 300 files", r3 - r2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preload_jobs_load_every_page_once_and_verify_repairs_stale_files() {
    let (dir, mut s) = common::settings();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("set/sub")).unwrap();
    let files: Vec<(String, Vec<u8>)> = (0..12)
        .map(|i| {
            let name = if i % 3 == 0 {
                format!("set/sub/f{i}")
            } else {
                format!("set/f{i}")
            };
            (
                name,
                bytes(500 + i, (i as usize % 4) * MIB + 1000 * i as usize),
            )
        })
        .collect();
    for (n, b) in &files {
        std::fs::write(data.join(n), b).unwrap();
    }
    let manifest = "{\"path\": \"/data/set/f1\"}\n/data/set/f2\n";
    std::fs::write(data.join("manifest.jsonl"), manifest).unwrap();
    s.mounts = vec![format!("/data=file://{}", data.display())];
    s.metadata_ttl = "600".into();
    let c = Cluster::start(dir, s);
    let pages: u64 = files
        .iter()
        .map(|(_, b)| b.len().div_ceil(MIB) as u64)
        .sum();

    // A manifest stored in the namespace itself, with a JSON line and a plain line.
    let out = c.pagectl(&["load", "--manifest", "/data/manifest.jsonl"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let f1_f2 = (files[1].1.len().div_ceil(MIB) + files[2].1.len().div_ceil(MIB)) as u64;
    assert!(text.contains(&format!("loaded {f1_f2} pages")), "{text}");
    assert!(text.contains("time to first page"), "{text}");

    // The whole prefix: the two files already loaded are skipped.
    let out = c.pagectl(&["load", "--prefix", "/data/set"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        text.contains(&format!("loaded {} pages", pages - f1_f2))
            && text.contains(&format!("{f1_f2} pages were cached already")),
        "{text}"
    );
    // Everything is a hit now.
    let client = c.client(ClientOptions::default()).await;
    let (h0, m0) = c.hits_and_misses(&client).await;
    for (n, b) in &files {
        let got = client
            .read(&format!("/data/{n}"), 0..u64::MAX)
            .await
            .unwrap();
        assert!(got[..] == b[..], "{n}");
    }
    let (h1, m1) = c.hits_and_misses(&client).await;
    assert_eq!((h1 - h0, m1 - m0), (pages, 0), "every page was preloaded");

    // A file rewritten behind the cache's back: --verify notices and repairs it.
    let changed = bytes(999, files[4].1.len());
    std::fs::write(c.dir.path().join("data").join(&files[4].0), &changed).unwrap();
    let out = c.pagectl(&["load", "--prefix", "/data/set", "--verify"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("1 files repaired"), "{text}");
    assert!(text.contains(&format!("{pages} pages compared")), "{text}");
    let got = client
        .read(&format!("/data/{}", files[4].0), 0..u64::MAX)
        .await
        .unwrap();
    assert!(got[..] == changed[..], "new readers see the repaired file");

    // free drops the cached pages (the data stays in the under storage).
    let out = c.pagectl(&["free", "/data/set/sub"]);
    assert!(out.status.success(), "{out:?}");
    let sub_pages: u64 = files
        .iter()
        .filter(|(n, _)| n.starts_with("set/sub/"))
        .map(|(_, b)| b.len().div_ceil(MIB) as u64)
        .sum();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        text.contains(&format!("freed {sub_pages} cached pages of 4 files")),
        "{text}"
    );
    let (h2, m2) = c.hits_and_misses(&client).await;
    for (n, b) in files.iter().filter(|(n, _)| n.starts_with("set/sub/")) {
        let got = client
            .read(&format!("/data/{n}"), 0..u64::MAX)
            .await
            .unwrap();
        assert!(got[..] == b[..], "{n}");
    }
    let (h3, m3) = c.hits_and_misses(&client).await;
    assert_eq!(
        (h3 - h2, m3 - m2),
        (0, sub_pages),
        "freed pages are misses again"
    );

    // Errors name the file.
    let out = c.pagectl(&["load", "--prefix", "/data/nothing-here"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing-here"));

    // Every node keeps the jobs' records: `pagectl jobs` and `/v1/jobs` show the three jobs
    // that ran (the last command failed before its job started), done, with their exact file
    // and byte counts.
    let out = c.pagectl(&["jobs"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let rows: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(rows.len(), 3, "{text}");
    assert!(rows.iter().all(|r| r.contains(" done ")), "{text}");
    assert!(text.contains("manifest /data/manifest.jsonl"), "{text}");
    assert!(text.contains("prefix /data/set"), "{text}");
    use pagestore_testkit::local_cluster::http_get;
    for n in &c.nodes {
        let (status, body) = http_get(n.admin.as_deref().unwrap(), "/v1/jobs").unwrap();
        assert_eq!(status, 200);
        let jobs: serde_json::Value = serde_json::from_str(&body).unwrap();
        let jobs = jobs.as_array().unwrap();
        assert_eq!(jobs.len(), 3, "{body}");
        // Most recent first: the --verify job, then the prefix job before it, ...
        let manifest_job = &jobs[2];
        assert_eq!(manifest_job["source"], "manifest /data/manifest.jsonl");
        assert_eq!(manifest_job["files_total"], 2);
        assert_eq!(manifest_job["files_done"], 2);
        assert_eq!(manifest_job["pages_loaded"], f1_f2);
        assert_eq!(
            manifest_job["bytes_done"],
            (files[1].1.len() + files[2].1.len()) as u64
        );
        let prefix_job = &jobs[1];
        assert_eq!(prefix_job["files_total"], 12);
        assert_eq!(prefix_job["pages_loaded"], pages - f1_f2);
        assert_eq!(prefix_job["pages_present"], f1_f2);
        assert!(prefix_job["first_page_secs"].as_f64().unwrap() > 0.0);
        let (_, metrics) = http_get(n.admin.as_deref().unwrap(), "/metrics").unwrap();
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("pagestore_load_jobs{")
                    && l.contains("state=\"done\"")
                    && l.ends_with(" 3")),
            "{metrics}"
        );
    }
}
