//! Membership in a real etcd (the `etcd` binary from Debian's etcd-server, started by the
//! test): nodes register under leases, clients and nodes follow the member set; the dynamic
//! ring drops a dead node, the static ring keeps its slot and reads its keys from the under
//! storage; an etcd outage of 30 seconds leaves reads working and membership recovers after.
//! The control plane's protection: etcd with authentication (right, wrong and missing
//! credentials, tokens that expire), over TLS with client certificates, no secrets in the
//! mount table, and readers that follow membership through a node without etcd access.
//! Write-back across a node counted down and back: a page rewritten meanwhile is read new.
#![allow(clippy::unwrap_used)]

mod common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use common::{bytes, Cluster, PAGECTL, PAGESTORED};
use pagestore_client::{
    etcd::EtcdOptions, Client, ClientOptions, ClusterSource, StatsSnapshot, WriteOptions,
};
use pagestore_protocol::node_id::parse_uuid;
use pagestore_testkit::local_cluster::{http_get, http_post, EtcdServer};

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

const ETCD_USER: &str = "pagestore";
const ETCD_PASSWORD: &str = "correct horse battery staple";

/// An etcd with authentication on (tokens live `token_ttl` seconds) and a cluster of three
/// single-shard dynamic-ring nodes that log in as `pagestore` with a password file, of which
/// the first `started` run, over a directory of 20 files.
fn etcd_cluster_with_auth(token_ttl: u32, started: usize) -> (EtcdServer, Cluster, Files) {
    let (dir, mut s) = common::settings();
    let etcd_dir = dir.path().join("etcd");
    std::fs::create_dir_all(&etcd_dir).unwrap();
    let etcd = EtcdServer::start_with(
        &etcd_dir,
        None,
        vec![format!("--auth-token-ttl={token_ttl}")],
    )
    .unwrap();
    etcd.enable_auth("root-password", ETCD_USER, ETCD_PASSWORD)
        .unwrap();
    let pw = dir.path().join("etcd-password");
    write_secret(&pw, &format!("{ETCD_PASSWORD}\n"));
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut files = Vec::new();
    for i in 0..20u64 {
        let len = (i as usize * 91_111) % (2 << 20);
        let b = bytes(i + 500, len);
        std::fs::write(data.join(format!("f{i:02}")), &b).unwrap();
        files.push((format!("/data/f{i:02}"), b));
    }
    s.mounts = vec![format!("/data=file://{}", data.display())];
    s.shards = 1;
    s.etcd = Some(etcd.url("secure"));
    s.start = Some(started);
    s.extra = [
        "--lease-ttl",
        LEASE_TTL,
        "--ring-mode",
        "dynamic",
        "--etcd-user",
        ETCD_USER,
        "--etcd-password-file",
        &pw.display().to_string(),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    (etcd, Cluster::start(dir, s), files)
}

fn write_secret(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// `pagectl --cluster ETCD --tls-dir CA ARGS` with `env` set and no other etcd settings from
/// this process's environment.
fn pagectl_env(c: &Cluster, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(PAGECTL);
    cmd.arg("--cluster")
        .arg(c.etcd.as_deref().unwrap())
        .arg("--tls-dir")
        .arg(&c.ca_dir)
        .args(args);
    for k in [
        "PAGESTORE_ETCD_USER",
        "PAGESTORE_ETCD_PASSWORD",
        "PAGESTORE_ETCD_PASSWORD_FILE",
    ] {
        cmd.env_remove(k);
    }
    cmd.envs(env.iter().copied()).output().unwrap()
}

/// Starts a node against `etcd_url` with `extra` flags, expecting it to give up (it must not
/// join); returns its output.
fn pagestored_refused(dir: &Path, etcd_url: &str, extra: &[&str]) -> Output {
    let cache = dir.join(format!("refused-{}", extra.len()));
    std::fs::create_dir_all(&cache).unwrap();
    let mut child = Command::new(PAGESTORED)
        .args(["--cache-dir", &cache.display().to_string()])
        .args(["--cache-size", "64M", "--page-size", "1M", "--shards", "1"])
        .args(["--listen", "127.0.0.1:7990", "--admin", "off", "--no-pin"])
        .args(["--mount", &format!("/x=file://{}", cache.display())])
        .args(["--etcd", etcd_url])
        .args(extra)
        .env_remove("PAGESTORE_ETCD_USER")
        .env_remove("PAGESTORE_ETCD_PASSWORD")
        .env_remove("PAGESTORE_ETCD_PASSWORD_FILE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("pagestored {extra:?} joined (or hung) instead of being refused");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "{out:?}");
    out
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// Every key and value in etcd, decoded (read with `token`).
fn etcd_dump(etcd: &EtcdServer, token: Option<&str>) -> Vec<(String, String)> {
    let base = format!("http://127.0.0.1:{}", etcd.client_port);
    let body = serde_json::json!({"key": B64.encode([0u8]), "range_end": B64.encode([0u8])});
    let (status, text) = http_post(&base, "/v3/kv/range", &body.to_string(), token).unwrap();
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let dec = |x: &serde_json::Value| {
        String::from_utf8_lossy(&B64.decode(x.as_str().unwrap_or("")).unwrap()).to_string()
    };
    v["kvs"]
        .as_array()
        .map(|kvs| {
            kvs.iter()
                .map(|kv| (dec(&kv["key"]), dec(&kv["value"])))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_with_authentication_admits_only_the_right_credentials() {
    // Tokens live 2 s: every node and client below must log in again, repeatedly.
    let (etcd, mut c, files) = etcd_cluster_with_auth(2, 1);
    let url = c.etcd.clone().unwrap();
    let base = format!("http://127.0.0.1:{}", etcd.client_port);

    // Node 0 joined with the right credentials. Wrong or missing ones are refused clearly.
    let bad = c.dir.path().join("bad-password");
    write_secret(&bad, "not the password\n");
    let out = pagestored_refused(
        c.dir.path(),
        &url,
        &[
            "--etcd-user",
            ETCD_USER,
            "--etcd-password-file",
            &bad.display().to_string(),
        ],
    );
    assert!(
        stderr(&out).contains("wrong user name or password"),
        "{}",
        stderr(&out)
    );
    let out = pagestored_refused(c.dir.path(), &url, &[]);
    assert!(
        stderr(&out).contains("requires authentication"),
        "{}",
        stderr(&out)
    );
    let out = pagestored_refused(c.dir.path(), &url, &["--etcd-user", ETCD_USER]);
    assert!(stderr(&out).contains("no password"), "{}", stderr(&out));

    // Without credentials nobody reads or writes the mount table (nor anything else).
    let out = pagectl_env(&c, &["mount", "ls"], &[]);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        stderr(&out).contains("requires authentication"),
        "{}",
        stderr(&out)
    );
    let out = pagectl_env(&c, &["mount", "set", "/etc", "file:///etc"], &[]);
    assert!(!out.status.success(), "{out:?}");
    let wrong = [
        ("PAGESTORE_ETCD_USER", ETCD_USER),
        ("PAGESTORE_ETCD_PASSWORD", "guess"),
    ];
    let out = pagectl_env(&c, &["mount", "set", "/etc", "file:///etc"], &wrong);
    assert!(
        stderr(&out).contains("wrong user name or password"),
        "{}",
        stderr(&out)
    );
    let body = serde_json::json!({"key": B64.encode("/pagestore/"), "range_end": B64.encode("/pagestore0")});
    let (status, text) = http_post(&base, "/v3/kv/range", &body.to_string(), None).unwrap();
    assert_ne!(status, 200, "{text}");
    let right = [
        ("PAGESTORE_ETCD_USER", ETCD_USER),
        ("PAGESTORE_ETCD_PASSWORD", ETCD_PASSWORD),
    ];
    let out = pagectl_env(&c, &["mount", "ls"], &right);
    assert!(out.status.success(), "{out:?}");
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(table.starts_with("/data <- file://"), "{table}");
    assert!(!table.contains("/etc"), "{table}");

    // A client that follows etcd needs the credentials too; with them it reads.
    let tls = pagestore_client::tls::client_config(&c.ca_dir).unwrap();
    let anonymous = ClientOptions {
        etcd: Some(EtcdOptions::default()),
        ..ClientOptions::default()
    };
    let e = Client::connect(&c.source(), tls.clone(), None, anonymous)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("requires authentication"), "{e}");
    let with_login = ClientOptions {
        etcd: Some(EtcdOptions {
            user: Some(ETCD_USER.into()),
            password: Some(ETCD_PASSWORD.into()),
            ..EtcdOptions::default()
        }),
        ..ClientOptions::default()
    };
    let operator = Client::connect(&c.source(), tls, None, with_login)
        .await
        .unwrap();
    read_everything(&operator, &files).await;

    // The tokens expire (2 s here); node 0 and the client log in again and keep following:
    // both see node 1 join.
    tokio::time::sleep(Duration::from_secs(5)).await;
    c.start_node(1);
    let joined = id_of(&c, 1);
    wait_for(
        "the etcd client to see node 1 after its token expired",
        Duration::from_secs(15),
        || node_ids(&operator).contains(&joined),
    )
    .await;
    let admin0 = c.nodes[0].admin.clone().unwrap();
    wait_for(
        "node 0 to see node 1 after its token expired",
        Duration::from_secs(15),
        || {
            let (_, body) = http_get(&admin0, "/v1/ring").unwrap();
            body.matches("\"id\"").count() == 2
        },
    )
    .await;
    assert_eq!(metric(&c, 0, "pagestore_etcd_reachable{"), Some(1));
    let pw_file = c.dir.path().join("etcd-password");
    let out = c.pagectl(&[
        "--etcd-user",
        ETCD_USER,
        "--etcd-password-file",
        &pw_file.display().to_string(),
        "members",
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches(" yes ").count(), 2 + 2, "{text}"); // 2 live, 2 slots
    read_everything(&operator, &files).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_given_one_node_follows_membership_without_etcd_access() {
    let (_etcd, mut c, files) = etcd_cluster_with_auth(300, 2);
    // The reader knows one node's address and nothing about etcd.
    let tls = pagestore_client::tls::client_config(&c.ca_dir).unwrap();
    let reader = Client::connect(
        &ClusterSource::Addr(c.nodes[0].base),
        tls,
        None,
        ClientOptions {
            membership_refresh: Duration::from_secs(1),
            etcd: Some(EtcdOptions::default()),
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();
    // Node 0 may answer before it has seen node 1 register; the reader catches up on its own.
    wait_for(
        "the reader to see both nodes",
        Duration::from_secs(15),
        || node_ids(&reader).len() == 2,
    )
    .await;
    assert!(reader.etcd().is_none());
    read_everything(&reader, &files).await;

    // A node joins: the reader routes to it.
    c.start_node(2);
    let joined = id_of(&c, 2);
    let secs = wait_for("the reader to see node 2", Duration::from_secs(15), || {
        node_ids(&reader).contains(&joined)
    })
    .await;
    println!("join seen by the reader after {secs:.2} s");
    let before = c.inner.hits_and_misses_of(&[2]).await.unwrap();
    read_everything(&reader, &files).await;
    let after = c.inner.hits_and_misses_of(&[2]).await.unwrap();
    assert!(
        after.0 + after.1 > before.0 + before.1,
        "no read reached the new node: {before:?} -> {after:?}"
    );

    // A node dies: the reader stops routing to it once its lease is gone.
    let dead = id_of(&c, 1);
    c.kill(1);
    let secs = wait_for("the reader to drop node 1", Duration::from_secs(25), || {
        !node_ids(&reader).contains(&dead)
    })
    .await;
    println!("departure seen by the reader after {secs:.2} s (lease TTL {LEASE_TTL} s)");
    assert_eq!(node_ids(&reader).len(), 2);
    wait_for(
        "the live nodes to drop node 1",
        Duration::from_secs(10),
        || {
            [0, 2]
                .iter()
                .all(|&i| metric(&c, i, "pagestore_ring_nodes{") == Some(2))
        },
    )
    .await;
    let s0 = reader.stats();
    read_everything(&reader, &files).await;
    let s1 = reader.stats();
    assert_eq!(s1.fallbacks, s0.fallbacks, "every key has a live owner");
    assert_eq!(
        s1.member_failures, s0.member_failures,
        "node 1 is not asked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_urls_in_etcd_hold_no_secrets() {
    const KEY: &str = "AKIDETCDMOUNTTEST";
    const SECRET: &str = "etcd-mount-test-secret";
    let root = tempfile::tempdir().unwrap();
    let bucket = root.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    let files: Files = (0..6u64)
        .map(|i| {
            let b = bytes(i + 900, 300_000 * i as usize + 1);
            std::fs::write(bucket.join(format!("o{i}")), &b).unwrap();
            (format!("/s3/o{i}"), b)
        })
        .collect();
    let s3 = pagestore_testkit::S3Server::start(root.path(), KEY, SECRET).unwrap();
    let secret_url = format!(
        "s3://bucket?endpoint={}&region=us-east-1&access_key_id={KEY}&secret_access_key={SECRET}",
        s3.endpoint()
    );
    let (dir, mut s) = common::settings();
    let etcd_dir = dir.path().join("etcd");
    std::fs::create_dir_all(&etcd_dir).unwrap();
    let etcd = EtcdServer::start(&etcd_dir).unwrap();
    s.mounts = vec![format!("/s3={secret_url}")];
    s.shards = 1;
    s.nodes = 1;
    s.etcd = Some(etcd.url("nosecrets"));
    // The local directory mounted through etcd below must be one this node allows.
    s.extra = vec!["--allow-file-root".into(), dir.path().display().to_string()];
    let c = Cluster::start(dir, s);

    // The node seeded the table without the credentials.
    let dump = etcd_dump(&etcd, None);
    assert!(
        dump.iter().any(|(k, _)| k.ends_with("/mounts//s3")),
        "{dump:?}"
    );
    for (k, v) in &dump {
        assert!(
            !v.contains(SECRET) && !v.contains(KEY),
            "{k} holds a secret: {v}"
        );
    }
    let stored = &dump
        .iter()
        .find(|(k, _)| k.ends_with("/mounts//s3"))
        .unwrap()
        .1;
    assert_eq!(*stored, pagestore_client::ufs::redact(&secret_url));

    // The node still reads S3 with its own credentials (no client fallback: the node loads).
    let reader = c
        .client(ClientOptions {
            fallback: false,
            ..ClientOptions::default()
        })
        .await;
    read_everything(&reader, &files[..3].to_vec()).await;

    // pagectl refuses to put credentials in etcd.
    let out = c.pagectl(&["mount", "set", "/s3x", &secret_url]);
    assert!(!out.status.success(), "{out:?}");
    assert!(stderr(&out).contains("credentials"), "{}", stderr(&out));
    let out = c.pagectl(&["mount", "set", "/u", "s3://user:pw@bucket"]);
    assert!(!out.status.success(), "{out:?}");
    assert!(etcd_dump(&etcd, None)
        .iter()
        .all(|(_, v)| !v.contains(SECRET) && !v.contains("pw@")));

    // A change of the table in etcd is applied with the node's credentials kept on /s3: the
    // objects not read yet load from S3.
    let more = c.dir.path().join("more");
    std::fs::create_dir_all(&more).unwrap();
    std::fs::write(more.join("x"), b"second mount").unwrap();
    let out = c.pagectl(&[
        "mount",
        "set",
        "/more",
        &format!("file://{}", more.display()),
    ]);
    assert!(out.status.success(), "{out:?}");
    let start = Instant::now();
    while reader.read("/more/x", 0..100).await.is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "/more not applied"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    read_everything(&reader, &files[3..].to_vec()).await;
    let out = c.pagectl(&["mount", "ls"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        !text.contains(SECRET) && !text.contains("credentials stored"),
        "{text}"
    );
}

/// A CA, a certificate for etcd at 127.0.0.1 and a client certificate, as PEM files in `dir`:
/// `(ca, server cert, server key, client cert, client key)`.
fn etcd_certificates(dir: &Path) -> [PathBuf; 5] {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "etcd test CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issue = |san: Vec<String>, usage: Vec<ExtendedKeyUsagePurpose>, name: &str| {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(san).unwrap();
        p.distinguished_name.push(DnType::CommonName, name);
        p.extended_key_usages = usage;
        let cert = p.signed_by(&key, &ca_cert, &ca_key).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    // etcd's JSON gateway connects to etcd's own gRPC server with the server certificate as
    // its client certificate: with --client-cert-auth it needs both usages.
    let (server, server_key) = issue(
        vec!["127.0.0.1".into()],
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        "etcd",
    );
    let (client, client_key) = issue(
        vec![],
        vec![ExtendedKeyUsagePurpose::ClientAuth],
        "pagestore",
    );
    let paths = [
        "ca.pem",
        "server.pem",
        "server-key.pem",
        "client.pem",
        "client-key.pem",
    ]
    .map(|n| dir.join(n));
    for (p, text) in paths
        .iter()
        .zip([ca_cert.pem(), server, server_key, client, client_key])
    {
        write_secret(p, &text);
    }
    paths
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_tls_with_a_client_certificate() {
    let (dir, mut s) = common::settings();
    let etcd_dir = dir.path().join("etcd");
    std::fs::create_dir_all(&etcd_dir).unwrap();
    let [ca, cert, key, client, client_key] = etcd_certificates(dir.path());
    let etcd =
        EtcdServer::start_with(&etcd_dir, Some((cert, key, ca.clone())), Vec::new()).unwrap();
    let url = etcd.url("tls");
    assert!(url.starts_with("etcds://"));
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("a"), b"over TLS").unwrap();
    s.mounts = vec![format!("/data=file://{}", data.display())];
    s.shards = 1;
    s.nodes = 1;
    s.etcd = Some(url.clone());
    let tls_flags: Vec<String> = [
        "--etcd-ca",
        &ca.display().to_string(),
        "--etcd-cert",
        &client.display().to_string(),
        "--etcd-key",
        &client_key.display().to_string(),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    s.extra = tls_flags.clone();
    // The node joins over TLS with its client certificate.
    let c = Cluster::start(dir, s);
    let mut args: Vec<&str> = tls_flags.iter().map(String::as_str).collect();
    args.push("members");
    let out = c.pagectl(&args);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&c.nodes[0].id),
        "{out:?}"
    );
    let reader = c
        .client(ClientOptions {
            etcd: Some(EtcdOptions {
                ca: Some(ca.clone()),
                cert: Some(client.clone()),
                key: Some(client_key.clone()),
                ..EtcdOptions::default()
            }),
            ..ClientOptions::default()
        })
        .await;
    assert_eq!(
        &reader.read("/data/a", 0..100).await.unwrap()[..],
        b"over TLS"
    );

    // Without the client certificate etcd refuses the connection; without the CA the server
    // is not trusted; plain etcd:// to a TLS port fails too.
    let out = c.pagectl(&["--etcd-ca", &ca.display().to_string(), "members"]);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        stderr(&out).contains("etcd unreachable"),
        "{}",
        stderr(&out)
    );
    let out = c.pagectl(&[
        "--etcd-cert",
        &client.display().to_string(),
        "--etcd-key",
        &client_key.display().to_string(),
        "members",
    ]);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        stderr(&out).to_lowercase().contains("certificate"),
        "{}",
        stderr(&out)
    );
    let plain = url.replacen("etcds://", "etcd://", 1);
    let out = Command::new(PAGECTL)
        .args(["--cluster", &plain, "members"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    // TLS settings with a plain URL are a mistake, said as such.
    let out = Command::new(PAGECTL)
        .args([
            "--cluster",
            &plain,
            "--etcd-ca",
            &ca.display().to_string(),
            "members",
        ])
        .output()
        .unwrap();
    assert!(stderr(&out).contains("etcds://"), "{}", stderr(&out));
}

/// A write-back file's page rewritten while the page's owner was down (etcd counted it down,
/// so the writer wrote the new bytes to the other members) and the owner restarted with the
/// earlier bytes on its disk: readers, who ask the owner first, get the new bytes (the owner
/// answers that its copy was recovered), and so does the flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_rewritten_while_its_owner_was_down_is_read_new_after_the_owner_returns() {
    let (dir, mut s) = common::settings();
    let etcd_dir = dir.path().join("etcd");
    let store = dir.path().join("store");
    std::fs::create_dir_all(&etcd_dir).unwrap();
    std::fs::create_dir_all(&store).unwrap();
    let _etcd = EtcdServer::start(&etcd_dir).unwrap();
    s.mounts = vec![format!("/ck=file://{}?write=back", store.display())];
    s.shards = 1;
    s.etcd = Some(_etcd.url("wb"));
    s.extra = [
        "--lease-ttl",
        LEASE_TTL,
        "--ring-mode",
        "static",
        "--write-replicas",
        "2",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let mut c = Cluster::start(dir, s);
    let writer = c.client(ClientOptions::default()).await;
    // Whatever the member it asked knew when it connected (the nodes join one by one), the
    // client writes as many copies as the ring it follows can hold.
    wait_for(
        "the client to see three nodes",
        Duration::from_secs(20),
        || node_ids(&writer).len() == 3,
    )
    .await;
    assert_eq!(writer.write_replicas(), 2);
    let old = bytes(61, 300_000);
    let new = bytes(62, 250_000);
    let mut model = old.clone();
    model[..new.len()].copy_from_slice(&new);
    // Killed and restarted (it recovers the page from its disk); then frozen until its lease
    // lapses and thawed (it finds its lease lost before it registers again).
    for (away, name) in [("killed", "log.bin"), ("frozen", "log2.bin")] {
        let path = format!("/ck/run/{name}");
        let mut w = writer.create(&path, WriteOptions::default()).await.unwrap();
        w.write_at(0, &old).await.unwrap();
        w.flush().await.unwrap();
        let file_id = pagestore_protocol::ring::file_id(&path, w.version());
        let owner = writer.membership().ring().replicas(file_id, 0, 1)[0].node;
        let i = (0..3).find(|&i| id_of(&c, i) == owner).unwrap();
        match away {
            "killed" => c.kill(i),
            _ => c.signal(i, libc::SIGSTOP).unwrap(),
        }
        wait_for(
            "the writer to see the owner down",
            Duration::from_secs(20),
            || writer.down_members() == vec![owner],
        )
        .await;
        w.write_at(0, &new).await.unwrap();
        w.flush().await.unwrap();
        match away {
            "killed" => c.start_node(i),
            _ => c.signal(i, libc::SIGCONT).unwrap(),
        }
        wait_for(
            "the owner to be live again",
            Duration::from_secs(20),
            || writer.down_members().is_empty(),
        )
        .await;
        let reader = c.client(ClientOptions::default()).await;
        let info = reader.stat(&path).await.unwrap();
        let got = reader.read_at(&info, 0, info.size).await.unwrap();
        assert!(
            got[..] == model[..],
            "{away}: read after the owner returned"
        );

        w.close().await.unwrap();
        let out = c.pagectl(&["sync", "/ck"]);
        assert!(out.status.success(), "{away}: {out:?}");
        assert!(std::fs::read(store.join("run").join(name)).unwrap() == model);
        let got = reader.read_at(&info, 0, info.size).await.unwrap();
        assert!(got[..] == model[..], "{away}: read after the flush");
    }
}
