//! Membership in a real etcd (the `etcd` binary from Debian's etcd-server, started by the
//! test): nodes register under leases, clients and nodes follow the member set; the dynamic
//! ring drops a dead node, the static ring keeps its slot and reads its keys from the under
//! storage; an etcd outage of 30 seconds leaves reads working and membership recovers after.
#![allow(clippy::unwrap_used)]

mod common;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use common::{bytes, Cluster};
use pagestore_client::{Client, ClientOptions, StatsSnapshot};
use pagestore_net::node_id::parse_uuid;
use pagestore_tools::local_cluster::{http_get, EtcdServer};

const LEASE_TTL: &str = "3";

type Files = Vec<(String, Vec<u8>)>;

/// An etcd server and a cluster of three single-shard nodes registered in it, of which the
/// first `started` run, over a directory of 40 files.
fn etcd_cluster(mode: &str, started: usize) -> (EtcdServer, Cluster, Files) {
    let (dir, mut s) = common::settings();
    let etcd_dir = dir.path().join("etcd");
    std::fs::create_dir_all(&etcd_dir).unwrap();
    let etcd = EtcdServer::start(&etcd_dir).unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut files = Vec::new();
    for i in 0..40u64 {
        let len = (i as usize * 77_777) % (3 << 20);
        let b = bytes(i + 100, len);
        std::fs::write(data.join(format!("f{i:02}")), &b).unwrap();
        files.push((format!("/data/f{i:02}"), b));
    }
    s.mounts = vec![format!("/data=file://{}", data.display())];
    s.shards = 1;
    s.etcd = Some(etcd.url("test"));
    s.start = Some(started);
    s.extra = ["--lease-ttl", LEASE_TTL, "--ring-mode", mode]
        .iter()
        .map(|a| a.to_string())
        .collect();
    // Mounts set in etcd later may name any directory of the test (and nothing else).
    s.extra.push("--allow-file-root".into());
    s.extra.push(dir.path().display().to_string());
    (etcd, Cluster::start(dir, s), files)
}

/// Polls `f` every 100 ms until it holds; panics after `limit`. Returns the seconds waited.
async fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> f64 {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    start.elapsed().as_secs_f64()
}

async fn read_everything(client: &Client, files: &Files) {
    for (p, want) in files {
        let got = client.read(p, 0..u64::MAX).await.unwrap();
        assert!(got[..] == want[..], "{p}: wrong bytes");
    }
}

fn node_ids(client: &Client) -> Vec<u128> {
    let mut v: Vec<u128> = client.membership().nodes().map(|n| n.id).collect();
    v.sort_unstable();
    v
}

fn id_of(c: &Cluster, i: usize) -> u128 {
    parse_uuid(&c.nodes[i].id).unwrap()
}

/// The value of the metric line that starts with `name` in node `i`'s /metrics.
fn metric(c: &Cluster, i: usize, name: &str) -> Option<u64> {
    let admin = c.nodes[i].admin.as_deref()?;
    let (status, body) = http_get(admin, "/metrics").ok()?;
    assert_eq!(status, 200);
    body.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_ring_follows_nodes_joining_dying_and_leaving() {
    let (_etcd, mut c, files) = etcd_cluster("dynamic", 2);
    let client: Arc<Client> = c.client(ClientOptions::default()).await;
    assert_eq!(node_ids(&client).len(), 2);
    read_everything(&client, &files).await;

    // A node joins: clients route to it within seconds.
    c.start_node(2);
    let joined = id_of(&c, 2);
    let secs = wait_for(
        "the client to see the new node",
        Duration::from_secs(10),
        || node_ids(&client).contains(&joined),
    )
    .await;
    println!("join seen by the client after {secs:.2} s");
    assert!(client.stats().ring_updates >= 1);
    let before = c.inner.hits_and_misses_of(&[2]).await.unwrap();
    read_everything(&client, &files).await;
    let after = c.inner.hits_and_misses_of(&[2]).await.unwrap();
    assert!(
        after.0 + after.1 > before.0 + before.1,
        "no read reached the new node: {before:?} -> {after:?}"
    );
    // The nodes follow too: node 0's ring has three members.
    let admin0 = c.nodes[0].admin.clone().unwrap();
    wait_for(
        "node 0 to see three members",
        Duration::from_secs(10),
        || {
            let (_, body) = http_get(&admin0, "/v1/ring").unwrap();
            body.matches("\"id\"").count() == 3
        },
    )
    .await;

    // A node is SIGKILLed: its lease expires and the dynamic ring drops it.
    let dead = id_of(&c, 1);
    c.kill(1);
    let secs = wait_for(
        "the dead node to leave the ring",
        Duration::from_secs(20),
        || !node_ids(&client).contains(&dead),
    )
    .await;
    println!("dead node dropped after {secs:.2} s (lease TTL {LEASE_TTL} s)");
    assert_eq!(node_ids(&client).len(), 2);
    wait_for("the live nodes to drop it", Duration::from_secs(10), || {
        [0, 2]
            .iter()
            .all(|&i| metric(&c, i, "pagestore_ring_nodes{") == Some(2))
    })
    .await;
    let s0: StatsSnapshot = client.stats();
    read_everything(&client, &files).await;
    let s1 = client.stats();
    assert_eq!(
        s1.fallbacks, s0.fallbacks,
        "every key has a live owner again: no reads from the under storage"
    );
    assert_eq!(s1.member_failures, s0.member_failures);

    // A node stopped with SIGTERM leaves at once (it revokes its lease).
    let leaving = id_of(&c, 2);
    assert!(c.terminate(2).success());
    wait_for("the stopped node to leave", Duration::from_secs(10), || {
        !node_ids(&client).contains(&leaving)
    })
    .await;
    wait_for(
        "node 0's metrics to show a one-node ring",
        Duration::from_secs(10),
        || metric(&c, 0, "pagestore_ring_nodes{") == Some(1),
    )
    .await;
    assert_eq!(metric(&c, 0, "pagestore_etcd_reachable{"), Some(1));
    read_everything(&client, &files).await;

    // pagectl reads the member records from etcd.
    let out = c.pagectl(&["members"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ring mode dynamic"), "{text}");
    assert_eq!(text.matches(" yes ").count(), 3 + 1, "{text}"); // 3 slots, 1 live
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_ring_keeps_a_dead_nodes_slot_and_survives_an_etcd_outage() {
    let (mut etcd, mut c, files) = etcd_cluster("static", 3);
    let client: Arc<Client> = c.client(ClientOptions::default()).await;
    assert_eq!(node_ids(&client).len(), 3);
    read_everything(&client, &files).await;
    read_everything(&client, &files).await; // warm everywhere

    // Node 1 dies: it stays in the ring, marked down; its keys come from the under storage
    // without waiting for timeouts.
    let dead = id_of(&c, 1);
    c.kill(1);
    let secs = wait_for(
        "the client to see node 1 down",
        Duration::from_secs(20),
        || client.down_members() == vec![dead],
    )
    .await;
    println!("node 1 seen down after {secs:.2} s");
    assert_eq!(node_ids(&client).len(), 3, "the static ring keeps the slot");
    let s0 = client.stats();
    read_everything(&client, &files).await;
    let s1 = client.stats();
    assert!(
        s1.fallbacks > s0.fallbacks,
        "node 1's keys come from the UFS"
    );
    assert_eq!(
        s1.member_failures, s0.member_failures,
        "a member known down is not asked"
    );
    let out = c.pagectl(&["ring"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("DOWN"),
        "{out:?}"
    );

    // It returns with its cache still warm: every read it serves is a hit.
    c.start_node(1);
    wait_for("node 1 to be live again", Duration::from_secs(10), || {
        client.down_members().is_empty()
    })
    .await;
    let s2 = client.stats();
    read_everything(&client, &files).await;
    let s3 = client.stats();
    assert_eq!(s3.fallbacks, s2.fallbacks);
    let (hits, misses) = c.inner.hits_and_misses_of(&[1]).await.unwrap();
    assert!(hits > 0, "node 1 served none of its keys");
    assert_eq!(misses, 0, "node 1's cache was not warm after its restart");

    // etcd is down for 30 seconds: reads keep working on the last known ring.
    etcd.stop();
    let outage = Instant::now();
    wait_for(
        "node 0 to notice etcd is gone",
        Duration::from_secs(15),
        || metric(&c, 0, "pagestore_etcd_reachable{") == Some(0),
    )
    .await;
    while outage.elapsed() < Duration::from_secs(30) {
        let s = client.stats();
        read_everything(&client, &files).await;
        let t = client.stats();
        assert_eq!(
            t.fallbacks, s.fallbacks,
            "reads during the outage hit the ring"
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    assert_eq!(node_ids(&client).len(), 3);
    assert!(client.down_members().is_empty());

    // etcd returns: the nodes renew (or re-register) and membership changes flow again.
    etcd.restart().unwrap();
    wait_for(
        "node 0 to reach etcd again",
        Duration::from_secs(20),
        || metric(&c, 0, "pagestore_etcd_reachable{") == Some(1),
    )
    .await;
    let out = c.pagectl(&["members"]);
    assert!(out.status.success(), "{out:?}");
    let gone = id_of(&c, 2);
    c.kill(2);
    wait_for(
        "the client to see node 2 down after the outage",
        Duration::from_secs(25),
        || client.down_members() == vec![gone],
    )
    .await;
    read_everything(&client, &files).await;

    // An operator removes the dead node's slot: its keys move to the live nodes.
    let out = c.pagectl(&["node", "remove", &c.nodes[2].id]);
    assert!(out.status.success(), "{out:?}");
    wait_for(
        "the slot to leave the ring",
        Duration::from_secs(10),
        || !node_ids(&client).contains(&gone) && client.down_members().is_empty(),
    )
    .await;
    // Clients and nodes follow etcd independently; until the nodes have the new ring too, a
    // node may refuse a key it is about to own (the client then reads it from the UFS).
    wait_for(
        "the nodes to drop the slot",
        Duration::from_secs(10),
        || (0..2).all(|i| metric(&c, i, "pagestore_ring_nodes{") == Some(2)),
    )
    .await;
    let s4 = client.stats();
    read_everything(&client, &files).await;
    assert_eq!(client.stats().fallbacks, s4.fallbacks);
    // A live node's slot cannot be removed by mistake.
    let out = c.pagectl(&["node", "remove", &c.nodes[0].id]);
    assert!(!out.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mount_table_lives_in_etcd() {
    let (_etcd, c, files) = etcd_cluster("dynamic", 1);
    let client: Arc<Client> = c.client(ClientOptions::default()).await;
    read_everything(&client, &files[..3].to_vec()).await;
    let out = c.pagectl(&["mount", "ls"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.starts_with("/data <- file://"), "{text}");

    // A second mount added in etcd is served by the running node within seconds.
    let more = c.dir.path().join("more");
    std::fs::create_dir_all(&more).unwrap();
    std::fs::write(more.join("x"), b"from the second mount").unwrap();
    let url = format!("file://{}", more.display());
    let out = c.pagectl(&["mount", "set", "/more", &url]);
    assert!(out.status.success(), "{out:?}");
    let mut got = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(15) {
        match client.read("/more/x", 0..100).await {
            Ok(b) => {
                got = b.to_vec();
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    assert_eq!(got, b"from the second mount");
    // A mount outside the nodes' allowed roots is written to etcd but served by no node.
    let out = c.pagectl(&["mount", "set", "/etc", "file:///etc"]);
    assert!(out.status.success(), "{out:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        client.read("/etc/passwd", 0..100).await.is_err(),
        "a node served a file:// mount outside --allow-file-root"
    );
    assert_eq!(
        &client.read("/more/x", 0..100).await.unwrap()[..],
        b"from the second mount"
    );
    let out = c.pagectl(&["mount", "rm", "/nope"]);
    assert!(!out.status.success());
    let out = c.pagectl(&["mount", "set", "relative", &url]);
    assert!(!out.status.success());
}
