//! Cache controls enforced by a real `pagestored` and visible in its metrics: a quota'd prefix
//! never holds more than its quota while another prefix keeps its pages; `pagectl free` drops a
//! prefix; a TTL'd prefix is read again from the under storage once its pages are older than the
//! TTL; a pinned prefix survives a scan that evicts everything else. `/metrics` parses, and its
//! per-rule and per-shard counters agree with what the test did. Bad rules stop the daemon at
//! start with a clear message.
#![allow(clippy::unwrap_used)]

mod common;

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use common::{bytes, Cluster, PAGESTORED};
use pagestore_client::ClientOptions;
use pagestore_testkit::local_cluster::http_get;

const PAGE: usize = 64 << 10;

/// A parsed `/metrics` page: `(name, labels)` → value (the testkit's strict OpenMetrics reader
/// panics on anything a scraper would reject).
struct Metrics(BTreeMap<(String, String), f64>);

impl Metrics {
    fn parse(text: &str) -> Metrics {
        Metrics(pagestore_testkit::openmetrics::parse(text))
    }

    /// `pagestore_rule_<name>` of the rule with `prefix` (0 when the series is absent).
    fn rule(&self, name: &str, prefix: &str) -> u64 {
        let want = format!("rule=\"{prefix}\"");
        self.0
            .iter()
            .filter(|((n, l), _)| *n == format!("pagestore_rule_{name}") && l.contains(&want))
            .map(|(_, v)| *v as u64)
            .sum()
    }

    /// `pagestore_<name>` summed over the shards.
    fn total(&self, name: &str) -> u64 {
        let full = format!("pagestore_{name}");
        self.0
            .iter()
            .filter(|((n, _), _)| *n == full)
            .map(|(_, v)| *v as u64)
            .sum()
    }
}

fn metrics(admin: &str) -> Metrics {
    let (code, text) = http_get(admin, "/metrics").unwrap();
    assert_eq!(code, 200, "{text}");
    Metrics::parse(&text)
}

/// Polls `/metrics` until `done` holds (the loader stores a page just after serving it).
fn metrics_when(admin: &str, what: &str, done: impl Fn(&Metrics) -> bool) -> Metrics {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = metrics(admin);
        if done(&m) {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: inserts {} store failures {} ufs reads {} evictions {}",
            m.total("inserts_total"),
            m.total("store_failures_total"),
            m.total("ufs_reads_total"),
            m.total("evictions_total")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

const Q: &str = "/data/q";
const KEEP: &str = "/data/keep";
const TTL: &str = "/data/ttl";
const PIN: &str = "/data/pin";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_free_ttl_and_pin_behave_as_documented_and_metrics_agree() {
    let (dir, mut s) = common::settings();
    let data = dir.path().join("data");
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut add = |path: &str, len: usize| {
        files.insert(format!("/data/{path}"), bytes(files.len() as u64 + 1, len));
    };
    for i in 0..4 {
        add(&format!("q/f{i}"), 4 * PAGE);
    }
    add("keep/k", 4 * PAGE);
    add("ttl/t", 2 * PAGE);
    add("pin/p", 3 * PAGE - 100);
    // More pages than the whole cache (2 shards x 32 slots).
    add("scan/big", 160 * PAGE);
    for (path, b) in &files {
        let p = data.join(path.trim_start_matches("/data/"));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b).unwrap();
    }
    // Rules from the config file's [[rule]] tables.
    let config = dir.path().join("rules.toml");
    std::fs::write(
        &config,
        "[[rule]]\nprefix = \"/data/q/\"\nquota = \"512K\"\n\n\
         [[rule]]\nprefix = \"/data/keep\"\nttl = \"1h\"\n\n\
         [[rule]]\nprefix = \"/data/ttl\"\nttl = \"1s\"\n\n\
         [[rule]]\nprefix = \"/data/pin\"\npin = true\n",
    )
    .unwrap();
    s.nodes = 1;
    s.shards = 2;
    s.page_size = "64K".into();
    // Exactly 32 slots of 64 KiB per shard (a 1 MiB metadata region + 2 MiB of pages per file).
    s.cache_size = "6M".into();
    s.mounts = vec![format!("/data=file://{}", data.display())];
    s.extra = vec!["--config".into(), config.display().to_string()];
    let c = Cluster::start(dir, s);
    let admin = c.nodes[0].admin.clone().unwrap();
    let client = c
        .client(ClientOptions {
            // A read the node cannot serve fails the test instead of bypassing the cache.
            fallback: false,
            ..ClientOptions::default()
        })
        .await;
    let read = |path: &'static str| {
        let client = client.clone();
        let want = files[path].clone();
        async move {
            let got = client.read(path, 0..u64::MAX).await.unwrap();
            assert!(got[..] == want[..], "{path} read back wrong");
        }
    };

    // The rules as the node sees them.
    let (code, body) = http_get(&admin, "/v1/rules").unwrap();
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let prefixes: Vec<&str> = v["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["prefix"].as_str().unwrap())
        .collect();
    assert_eq!(prefixes, [KEEP, PIN, Q, TTL]);
    assert_eq!(v["rules"][2]["quota_bytes"], 512 << 10);
    assert_eq!(v["rules"][3]["ttl_ms"], 1000);
    let m = metrics(&admin);
    assert_eq!(m.rule("quota_bytes", Q), 512 << 10);
    assert_eq!(m.rule("ttl_seconds", KEEP), 3600);
    assert_eq!(m.total("ufs_reads_total"), 0);

    // Another prefix first, then four times the quota of the quota'd prefix.
    read("/data/keep/k").await;
    metrics_when(&admin, "keep stored", |m| {
        m.rule("inserts_total", KEEP) == 4
    });
    for i in 0..4 {
        let path = ["/data/q/f0", "/data/q/f1", "/data/q/f2", "/data/q/f3"][i];
        read(path).await;
        let done = 4 * (i as u64 + 1);
        let m = metrics_when(&admin, "q stored", |m| {
            m.rule("inserts_total", Q) + m.rule("quota_refusals_total", Q) == done
        });
        // 512 KiB over 2 shards: at most 4 pages of 64 KiB on each.
        assert!(
            m.rule("pages", Q) <= 8,
            "quota exceeded: {}",
            m.rule("pages", Q)
        );
        assert!(m.rule("bytes", Q) <= 512 << 10);
    }
    let m = metrics(&admin);
    let q_pages = m.rule("pages", Q);
    assert!(q_pages >= 4, "each shard keeps up to its share: {q_pages}");
    assert_eq!(
        m.rule("inserts_total", Q),
        q_pages + m.rule("quota_evictions_total", Q),
        "every stored page of the rule is cached or was evicted for the quota"
    );
    assert!(m.rule("quota_evictions_total", Q) >= 8);
    assert_eq!(m.rule("evictions_total", Q), 0, "the cache is not full");
    assert_eq!(m.rule("pages", KEEP), 4, "the other prefix keeps its pages");
    assert_eq!(m.rule("bytes", KEEP), 4 * PAGE as u64);
    assert_eq!(m.total("ufs_reads_total"), 20);
    assert_eq!(
        m.total("evictions_total"),
        m.rule("quota_evictions_total", Q)
    );
    let hits = m.total("hits_total");
    read("/data/keep/k").await;
    let m = metrics(&admin);
    assert_eq!(
        m.total("ufs_reads_total"),
        20,
        "keep was read from the cache"
    );
    assert_eq!(m.total("hits_total"), hits + 4);

    // pagectl free drops the prefix; the next read goes to the under storage again.
    let out = c.pagectl(&["free", KEEP]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(metrics(&admin).rule("pages", KEEP), 0);
    read("/data/keep/k").await;
    let m = metrics_when(&admin, "keep stored again", |m| {
        m.rule("inserts_total", KEEP) == 8
    });
    assert_eq!(m.total("ufs_reads_total"), 24);
    assert_eq!(m.rule("pages", KEEP), 4);

    // TTL: served from the cache while young, read again from the under storage once older.
    read("/data/ttl/t").await;
    metrics_when(&admin, "ttl stored", |m| m.rule("inserts_total", TTL) == 2);
    read("/data/ttl/t").await;
    let m = metrics(&admin);
    assert_eq!(m.total("ufs_reads_total"), 26, "young pages are hits");
    let misses = m.total("misses_total");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    read("/data/ttl/t").await;
    let m = metrics_when(&admin, "ttl stored again", |m| {
        m.rule("inserts_total", TTL) == 4
    });
    assert_eq!(m.rule("expirations_total", TTL), 2);
    assert_eq!(
        m.total("ufs_reads_total"),
        28,
        "expired pages come from the store"
    );
    assert_eq!(m.total("misses_total"), misses + 2);
    assert_eq!(m.rule("pages", TTL), 2);

    // Pin: a scan of more pages than the cache holds evicts everything but the pinned prefix.
    read("/data/pin/p").await;
    let m = metrics_when(&admin, "pin stored", |m| m.rule("inserts_total", PIN) == 3);
    assert_eq!(m.rule("pinned_bytes", PIN), 3 * PAGE as u64 - 100);
    assert_eq!(m.total("ufs_reads_total"), 31);
    read("/data/scan/big").await;
    // Every page loaded from the store is then stored, or served and not kept when no slot
    // could be freed at that moment: both are counted. (Counting inserts from a snapshot taken
    // before the scan races with earlier stores still being written.)
    let m = metrics_when(&admin, "scan stored", |m| {
        m.total("ufs_reads_total") == 191
            && m.total("inserts_total") + m.total("store_failures_total") == 191
    });
    assert_eq!(m.total("ufs_reads_total"), 191);
    assert_eq!(
        (m.rule("pages", PIN), m.rule("evictions_total", PIN)),
        (3, 0)
    );
    assert_eq!(m.rule("pins_refused_total", PIN), 0);
    for rule in [Q, KEEP, TTL] {
        assert_eq!(m.rule("pages", rule), 0, "{rule} survived the scan");
    }
    // Every page a rule stored is accounted for: cached, or gone for a stated reason.
    assert_eq!(
        m.rule("inserts_total", Q),
        m.rule("quota_evictions_total", Q) + m.rule("evictions_total", Q)
    );
    assert_eq!(
        m.rule("inserts_total", TTL),
        m.rule("expirations_total", TTL) + m.rule("evictions_total", TTL)
    );
    assert_eq!(
        m.rule("inserts_total", KEEP),
        4 + m.rule("evictions_total", KEEP),
        "4 freed, the rest evicted"
    );
    read("/data/pin/p").await;
    let m = metrics(&admin);
    assert_eq!(
        m.total("ufs_reads_total"),
        191,
        "the pinned prefix is still cached"
    );
    assert_eq!(m.rule("pages", PIN), 3);
    let used: u64 = m.total("used_bytes");
    assert!(used <= m.total("capacity_bytes"));
}

#[test]
fn bad_rules_stop_the_daemon_with_a_clear_message() {
    let home = tempfile::tempdir_in("/var/tmp").unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(PAGESTORED)
            .args(args)
            .args(["--no-pin", "--admin", "off", "--shards", "2"])
            .env("PAGESTORE_HOME", home.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let e = run(&["--rule", "/a:quota=1G", "--rule", "/a/:ttl=1s"]);
    assert!(e.contains("rule prefix /a appears twice"), "{e}");
    assert!(run(&["--rule", "/a:quota=lots"]).contains("rule /a: quota"));
    assert!(run(&["--rule", "/a:ttl=soon"]).contains("rule /a: ttl"));
    assert!(run(&["--rule", "/a:colour=red"]).contains("unknown key"));
    assert!(run(&["--rule", "/a:"]).contains("at least one of quota, ttl and pin"));
    assert!(run(&["--rule", "a:pin=true"]).contains("starting with /"));
    // Less than one page per shard: 2 shards x 4 MiB pages.
    let e = run(&["--rule", "/a:quota=1M"]);
    assert!(
        e.contains("rule /a: quota") && e.contains("smallest quota"),
        "{e}"
    );
    let bad = home.path().join("bad.toml");
    std::fs::write(&bad, "[[rule]]\nprefix = \"/a\"\nqouta = \"1G\"\n").unwrap();
    assert!(run(&["--config", bad.to_str().unwrap()]).contains("unknown field `qouta`"));
}
