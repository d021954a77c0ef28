//! Hot data through three real `pagestored` processes: many readers on several client
//! processes' worth of clients read one cold file at once, and the store is read exactly once
//! per page (counted by the nodes); then warm, from the memory tier; `pagectl top` and
//! `pagectl stat` show the hot file and the egress kept off the store; and a hot file served by
//! every node through hot-page replicas.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::bytes;
use pagestore_client::{Client, ClientOptions, ShardCounters};
use tokio::io::AsyncReadExt;

const MIB: usize = 1 << 20;
/// Pages of the file (1 MiB pages).
const PAGES: usize = 36;
/// Client instances (each its own connections, as separate machines would have), and readers
/// on each.
const CLIENTS: usize = 4;
const READERS_PER_CLIENT: usize = 4;

/// Held for the whole of each test: each starts a cluster of three nodes, and two at once on a
/// machine of two cores starve each other's nodes of CPU for longer than the clients' call
/// timeout (what the first test counts is fetch once under queueing, not under starvation).
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn read_all(client: &Arc<Client>, path: &str) -> Vec<u8> {
    let mut f = client.open(path).await.unwrap();
    let mut out = Vec::new();
    f.read_to_end(&mut out).await.unwrap();
    out
}

/// Every shard's counters summed.
async fn totals(client: &Client) -> ShardCounters {
    let mut t = ShardCounters::default();
    for (_, _, c) in client.shard_counters().await {
        let c = c.expect("every shard answers");
        t.ufs_reads += c.ufs_reads;
        t.ufs_bytes += c.ufs_bytes;
        t.ufs_repeat_reads += c.ufs_repeat_reads;
        t.coalesced += c.coalesced;
        t.served_bytes += c.served_bytes;
        t.memory_hits += c.memory_hits;
        t.memory_hit_bytes += c.memory_hit_bytes;
        t.memory_bytes += c.memory_bytes;
        t.hits += c.hits;
    }
    t
}

/// All readers of all clients read `path` whole at once; each must get `want`. Those of the
/// first half of the clients open it (a stat, then pages); those of the others read its pages
/// straight away with the metadata `clients[0]` got (as a data loader handed a file list
/// does), so that a fresh client's very first requests may be page requests that queue
/// behind slow loads.
async fn fan_out(clients: &[Arc<Client>], path: &str, want: &[u8]) {
    let info = clients[0].stat(path).await.unwrap();
    let start = Arc::new(tokio::sync::Barrier::new(CLIENTS * READERS_PER_CLIENT));
    let mut tasks = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        for _ in 0..READERS_PER_CLIENT {
            let (c, start, path, info) = (c.clone(), start.clone(), path.to_string(), info.clone());
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                if i < CLIENTS / 2 {
                    read_all(&c, &path).await
                } else {
                    c.read_at(&info, 0, info.size).await.unwrap().to_vec()
                }
            }));
        }
    }
    for t in tasks {
        assert!(t.await.unwrap() == want, "a reader got other bytes");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_readers_of_a_cold_file_cause_one_store_read_per_page() {
    let _alone = ALONE.lock().await;
    let (dir, mut s) = common::settings();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let file = bytes(42, PAGES * MIB);
    std::fs::write(data.join("weights.bin"), &file).unwrap();
    // A store that is slow per request (so that the readers' requests overlap on every page),
    // one store request at a time per shard (so that requests queue for longer than the
    // clients' call timeout below), priced; a replica to fall back to; a memory tier of 16 MiB
    // per node.
    s.mounts = vec![format!(
        "/data=file://{}?emulate_latency_ms=20&emulate_mbps=5&egress_usd_per_tb=90",
        data.display()
    )];
    s.extra = vec![
        "--replicas".into(),
        "1".into(),
        "--ufs-inflight".into(),
        "1".into(),
        "--memory-cache".into(),
        "16M".into(),
    ];
    let c = common::Cluster::start(dir, s);
    // A page (or a stat) waits behind its shard's other loads, 230 ms each (about 6 pages per
    // shard): more than the call timeout. Giving such a request up (and backing the member off) would send its pages
    // to a replica, which would read them from the store again (and then the client itself):
    // requests that wait on the store wait as long as their shard answers pings
    // (ClientOptions::store_timeout).
    // The silence rule's floor twice the call timeout (a store hedge's waits, half of it, as
    // long as the call timeout): this test is about fetch once under queueing, not about how
    // fast a dead member is left, and a loaded test machine starves a live node of CPU for
    // more than the default 200 ms (a false give-up sends the page to the replica, which reads
    // it from the store again).
    let options = ClientOptions {
        call_timeout: std::time::Duration::from_secs(1),
        min_silence: std::time::Duration::from_secs(2),
        ..ClientOptions::default()
    };
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        // The clients that read without a stat (`fan_out`) ask for every page at once: their
        // very first requests include pages queued behind the others' loads for longer than
        // the call timeout, before any member has answered them.
        let parallel = if i < CLIENTS / 2 {
            options.parallel
        } else {
            PAGES
        };
        let options = ClientOptions {
            parallel,
            ..options.clone()
        };
        clients.push(c.client(options).await);
    }
    let before = totals(&clients[0]).await;
    assert_eq!(before.ufs_reads, 0);

    fan_out(&clients, "/data/weights.bin", &file).await;
    let cold = totals(&clients[0]).await;
    let readers = (CLIENTS * READERS_PER_CLIENT) as u64;
    let size = file.len() as u64;
    let client_stats: Vec<_> = clients.iter().map(|c| c.stats()).collect();
    assert_eq!(
        cold.ufs_reads, PAGES as u64,
        "{readers} readers: one store read per page ({cold:?}, clients: {client_stats:?})"
    );
    assert_eq!(cold.ufs_bytes, size, "the file's size, once");
    assert_eq!(cold.ufs_repeat_reads, 0);
    assert!(cold.coalesced > 0, "no reader joined a load in flight");
    assert_eq!(cold.served_bytes, readers * size);
    for cl in &clients {
        let st = cl.stats();
        // Nor hedged to the store or a replica: the owners answered pings while loading.
        assert_eq!(
            (
                st.fallbacks,
                st.replica_reads,
                st.store_errors,
                st.store_hedges
            ),
            (0, 0, 0, 0),
            "{st:?}"
        );
    }

    // Warm: no store read at all, most pages from memory.
    fan_out(&clients, "/data/weights.bin", &file).await;
    let warm = totals(&clients[0]).await;
    let client_stats: Vec<_> = clients.iter().map(|c| c.stats()).collect();
    assert_eq!(
        warm.ufs_reads, PAGES as u64,
        "a warm read reached the store ({warm:?}, clients: {client_stats:?})"
    );
    assert_eq!(warm.served_bytes, 2 * readers * size);
    assert!(warm.memory_hits > 0, "{warm:?}");
    assert!(warm.memory_bytes > 0 && warm.memory_bytes <= 3 * 16 * MIB as u64);
    assert_eq!(warm.ufs_repeat_reads, 0);

    // What the operator sees: the hot file, and the egress kept off the store (all bytes
    // served but the file's one read: 2 x 16 x 36 MiB - 36 MiB).
    let out = c.pagectl(&["top", "--json", "--interval", "0.2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["nodes"].as_array().unwrap().len(), 3);
    assert_eq!(v["files"][0]["path"], "/data/weights.bin", "{v}");
    assert_eq!(v["files"][0]["bytes"], 2 * readers * size, "{v}");
    let mount = &v["mounts"][0];
    assert_eq!(mount["prefix"], "/data");
    assert_eq!(mount["usd_per_tb"], 90.0);
    let kept_off = (2 * readers - 1) * size;
    assert_eq!(mount["kept_off_bytes"], kept_off, "{v}");
    assert_eq!(mount["store_bytes"], size, "{v}");

    let out = c.pagectl(&["stat", "--interval", "0.2"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let line = format!(
        "mount /data: kept off the store: {}, about {} since start",
        pagestore_tools::top::bytes(kept_off as f64),
        pagestore_tools::top::dollars(kept_off as f64 / 1e12 * 90.0)
    );
    assert!(text.contains(&line), "no {line:?} in:\n{text}");

    let out = c.pagectl(&["top", "--count", "1", "--interval", "0.2"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("hot files") && text.contains("/data/weights.bin"),
        "{text}"
    );
    assert!(text.contains("memory tier"), "{text}");
    drop(clients);
    drop(c);
}

/// Every shard's counters, by node (summed over its shards).
async fn per_node(client: &Client) -> std::collections::BTreeMap<u128, ShardCounters> {
    let mut m = std::collections::BTreeMap::<u128, ShardCounters>::new();
    for (n, _, c) in client.shard_counters().await {
        let c = c.expect("every shard answers");
        let t = m.entry(n.id).or_default();
        t.served_bytes += c.served_bytes;
        t.ufs_reads += c.ufs_reads;
        t.hot_turned += c.hot_turned;
        t.hot_now += c.hot_now;
        t.replica_copies += c.replica_copies;
        t.replica_copy_failures += c.replica_copy_failures;
        t.replicas_held += c.replicas_held;
        t.replicas_dropped += c.replicas_dropped;
        t.replica_hot_reads += c.replica_hot_reads;
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_page_is_served_by_every_node_copied_once_from_its_owner_and_dropped_when_cold() {
    let _alone = ALONE.lock().await;
    let (dir, mut s) = common::settings();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    // Two pages everyone wants (a tokenizer, a small model's weights): without replicas, each
    // is served by its one owner.
    let pages = 2;
    let file = bytes(7, pages * MIB);
    std::fs::write(data.join("tokenizer.bin"), &file).unwrap();
    s.mounts = vec![format!("/data=file://{}", data.display())];
    s.extra = vec!["--hot-cool".into(), "2".into()];
    let c = common::Cluster::start(dir, s);
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(c.client(ClientOptions::default()).await);
    }
    // Every reader reads the file whole, again and again, until told to stop.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for cl in &clients {
        for _ in 0..READERS_PER_CLIENT {
            let (cl, stop, done, want) = (cl.clone(), stop.clone(), done.clone(), file.clone());
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    assert!(read_all(&cl, "/data/tokenizer.bin").await == want);
                    n += 1;
                    done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                n
            }));
        }
    }
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    // What the operator sees while it happens: the pages spread over 3 nodes, copies held.
    let top = {
        let c = &c;
        tokio::task::block_in_place(|| c.pagectl(&["top", "--json", "--interval", "0.5"]))
    };
    // The spread is in place now: what each node serves from here on shows how evenly readers
    // are spread (before it, the owners served every read, for as long as the page took to turn
    // hot, which depends on how loaded the machine is).
    let reads_from = done.load(std::sync::atomic::Ordering::Relaxed);
    let spread_from = per_node(&clients[0]).await;
    let hedges_from: u64 = clients.iter().map(|c| c.stats().hedges).sum();
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut reads = 0;
    for t in tasks {
        reads += t.await.unwrap();
    }
    assert!(
        top.status.success(),
        "{}",
        String::from_utf8_lossy(&top.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&top.stdout).unwrap();
    let spreads: Vec<u64> = v["pages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["spread"].as_u64().unwrap())
        .collect();
    assert!(spreads.contains(&3), "{v}");
    let nodes = v["nodes"].as_array().unwrap();
    let copies: u64 = nodes.iter().map(|n| n["replicas"].as_u64().unwrap()).sum();
    let hot: u64 = nodes.iter().map(|n| n["hot_pages"].as_u64().unwrap()).sum();
    assert!(copies >= 1 && hot >= 1, "{v}");

    let by_node = per_node(&clients[0]).await;
    let size = file.len() as u64;
    let total: u64 = by_node.values().map(|n| n.served_bytes).sum();
    // The store was read once per page; each page was copied once to each of its 2 other
    // members, from its owner; nothing fell back to the store.
    let sum = |f: fn(&ShardCounters) -> u64| by_node.values().map(f).sum::<u64>();
    // A read late at a page's replica may be hedged to its owner (which holds the page): the
    // request that lost was served too, in part or whole.
    let hedges: u64 = clients.iter().map(|c| c.stats().hedges).sum();
    let once = reads * size + sum(|n| n.replica_copies) * MIB as u64;
    assert!(
        (once..=once + hedges * MIB as u64).contains(&total),
        "every byte read was served once, and every copy, but for hedges: {total} served, \
         {once} read and copied, {hedges} hedges"
    );
    assert_eq!(sum(|n| n.ufs_reads), pages as u64);
    assert_eq!(sum(|n| n.hot_turned), pages as u64, "{by_node:?}");
    assert_eq!(sum(|n| n.replica_copies), 2 * pages as u64, "{by_node:?}");
    assert_eq!(sum(|n| n.replica_copy_failures), 0);
    // Once spread, two of every three page reads go to a copy: 4/3 per file read (two pages
    // each; 1.14-1.2 measured, the counters not being read at one instant). Asked: over 3/4.
    let hot_reads_window = sum(|n| n.replica_hot_reads)
        - spread_from
            .values()
            .map(|n| n.replica_hot_reads)
            .sum::<u64>();
    assert!(
        4 * hot_reads_window > 3 * (reads - reads_from),
        "{hot_reads_window} page reads at copies for {} file reads once spread: {by_node:?}",
        reads - reads_from
    );
    // Once spread, served by every node about evenly (the target: max/mean at most
    // 1.25), but for reads hedged to an owner in that time (served twice).
    let window: Vec<u64> = by_node
        .iter()
        .map(|(id, n)| n.served_bytes - spread_from[id].served_bytes)
        .collect();
    let hedged = (hedges - hedges_from) * MIB as u64;
    let mean = window.iter().sum::<u64>() as f64 / window.len() as f64;
    let max = *window.iter().max().unwrap() as f64;
    assert!(
        mean > 0.0 && (max - hedged as f64) / mean <= 1.25,
        "node bytes served once spread, max/mean {:.2}: {window:?}, {hedged} bytes hedged",
        max / mean
    );
    for cl in &clients {
        let st = cl.stats();
        assert!(st.hot_reads > 0, "{st:?}");
        assert_eq!((st.fallbacks, st.replica_reads), (0, 0), "{st:?}");
    }
    // Nobody reads any more: after --hot-cool (2 s) every copy is dropped.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let n = per_node(&clients[0]).await;
        let held: u64 = n.values().map(|n| n.replicas_held).sum();
        if held == 0 {
            let dropped: u64 = n.values().map(|n| n.replicas_dropped).sum();
            assert_eq!(dropped, 2 * pages as u64);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "copies still held: {n:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // A reader now goes to the owners again, and still reads the right bytes.
    assert!(read_all(&clients[0], "/data/tokenizer.bin").await == file);
    drop(clients);
    drop(c);
}
