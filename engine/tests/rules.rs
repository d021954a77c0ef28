//! Rules on a real engine: a quota'd rule stays within its quota while other pages stay, a TTL'd
//! page is a miss once it is older than the TTL, a pin rule's pages survive a flood, and the
//! per-rule accounting survives a restart (the rule number is in the slot header). A restart with
//! another set of rule prefixes drops the pages whose rule it can no longer know; one that only
//! lowers a quota trims the rule's oldest pages.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::{sync::Arc, time::Duration};

use common::*;
use pagestore_engine::{
    Engine, EngineConfig, EngineError, PageKey, Rule, RuleStats, Rules, ShardStats, StartError,
};

const PAGE: u32 = 64 * KIB;
const SLOTS: u64 = 20;

fn rule(prefix: &str, quota_pages: Option<u64>, ttl_ms: Option<u64>, pin: bool) -> Rule {
    Rule {
        prefix: prefix.into(),
        quota: quota_pages.map(|p| p * u64::from(PAGE)),
        ttl: ttl_ms.map(Duration::from_millis),
        pin,
    }
}

/// One shard of 20 slots with the given rules.
fn cfg(dir: &std::path::Path, rules: Vec<Rule>) -> EngineConfig {
    EngineConfig {
        rules: Arc::new(Rules::new(rules).unwrap()),
        ..config(dir, 1, PAGE, SLOTS)
    }
}

fn rule_stats(engine: &Engine, n: u8) -> RuleStats {
    block_on(engine.shards()[0].rule_stats()).unwrap()[usize::from(n)]
}

fn put(engine: &Engine, k: PageKey, rule: u8) {
    let data = page_bytes(k.file_id, k.page_index, 1, PAGE as usize);
    block_on(engine.shards()[0].put_in_rule(k, data, 1, rule)).unwrap();
}

fn cached(engine: &Engine, k: PageKey) -> bool {
    block_on(engine.shards()[0].get(k, 0, 16))
        .unwrap()
        .is_some()
}

#[test]
fn quota_ttl_and_pin_on_a_real_shard_and_across_a_restart() {
    let dir = tempdir();
    let rules = vec![
        rule("/quota", Some(4), None, false),
        rule("/pin", None, None, true),
        rule("/ttl", None, Some(300), false),
    ];
    let c = cfg(dir.path(), rules);
    let engine = start(c.clone());
    let r = engine.rules().clone();
    let (quota, pin, ttl) = (
        r.classify("/quota/f"),
        r.classify("/pin/f"),
        r.classify("/ttl/f"),
    );
    assert_eq!(
        (pin, quota, ttl),
        (1, 2, 3),
        "rule numbers follow the prefix order"
    );

    // Ten pages of the quota'd rule: only the newest four stay; no other page is touched.
    put(&engine, PageKey::new(9, 0), 0);
    for p in 0..3 {
        put(&engine, PageKey::new(1, p), pin);
    }
    for p in 0..10 {
        put(&engine, PageKey::new(2, p), quota);
        let st = rule_stats(&engine, quota);
        assert!(st.pages <= 4, "quota exceeded: {st:?}");
    }
    let st = rule_stats(&engine, quota);
    assert_eq!((st.pages, st.bytes), (4, 4 * u64::from(PAGE)));
    assert_eq!((st.inserts, st.quota_evictions), (10, 6));
    assert!((0..6).all(|p| !cached(&engine, PageKey::new(2, p))));
    assert!((6..10).all(|p| cached(&engine, PageKey::new(2, p))));
    assert!(cached(&engine, PageKey::new(9, 0)));

    // A flood of pages under no rule: everything unpinned goes, the pinned rule stays.
    for p in 0..40 {
        put(&engine, PageKey::new(3, p), 0);
    }
    assert!(
        (0..3).all(|p| cached(&engine, PageKey::new(1, p))),
        "pinned page evicted"
    );
    let st = rule_stats(&engine, pin);
    assert_eq!((st.pages, st.pinned_pages, st.evictions), (3, 3, 0));
    assert_eq!(
        rule_stats(&engine, quota).pages,
        0,
        "the flood evicts the quota'd rule"
    );
    assert!(block_on(engine.shards()[0].page_info(PageKey::new(1, 0)))
        .unwrap()
        .is_some_and(|i| i.pinned && i.rule == pin));

    // TTL: served until it is 300 ms old, then a miss that drops it.
    let t = PageKey::new(4, 0);
    put(&engine, t, ttl);
    assert!(cached(&engine, t));
    std::thread::sleep(Duration::from_millis(350));
    assert!(!block_on(engine.shards()[0].contains(t)).unwrap());
    let before = ShardStats::total(&block_on(engine.stats()).unwrap()).misses;
    assert!(!cached(&engine, t));
    assert_eq!(
        ShardStats::total(&block_on(engine.stats()).unwrap()).misses,
        before + 1
    );
    let st = rule_stats(&engine, ttl);
    assert_eq!((st.pages, st.expirations), (0, 1));
    // Stored again, it is served again (the expired copy does not count as present).
    put(&engine, t, ttl);
    assert!(cached(&engine, t));
    for p in 20..24 {
        put(&engine, PageKey::new(2, p), quota);
    }

    let want: Vec<RuleStats> = block_on(engine.shards()[0].rule_stats()).unwrap();
    engine.shutdown().unwrap();

    // Same rules: the accounting comes back from the headers.
    let engine = start(c.clone());
    let got = block_on(engine.shards()[0].rule_stats()).unwrap();
    for n in 0..4 {
        assert_eq!(
            (got[n].pages, got[n].bytes, got[n].pinned_pages),
            (want[n].pages, want[n].bytes, want[n].pinned_pages),
            "rule {n} after a restart"
        );
    }
    assert_eq!(got[usize::from(pin)].pages, 3);
    // The TTL counts from the original insert: the page expires on time after the restart.
    std::thread::sleep(Duration::from_millis(350));
    assert!(!cached(&engine, t));
    assert!((0..3).all(|p| cached(&engine, PageKey::new(1, p))));
    engine.shutdown().unwrap();

    // The quota lowered to one page: the rule's three older pages are trimmed at start.
    let mut lower = c.clone();
    lower.rules = Arc::new(
        Rules::new(vec![
            rule("/quota", Some(1), None, false),
            rule("/pin", None, None, true),
            rule("/ttl", None, Some(300), false),
        ])
        .unwrap(),
    );
    let engine = start(lower);
    let st = rule_stats(&engine, quota);
    assert_eq!((st.pages, st.quota_evictions), (1, 3), "{st:?}");
    assert!(cached(&engine, PageKey::new(2, 23)));
    assert_eq!(
        rule_stats(&engine, pin).pages,
        3,
        "same prefixes: pages kept"
    );
    put(&engine, PageKey::new(2, 30), quota);
    put(&engine, PageKey::new(2, 31), quota);
    assert_eq!(rule_stats(&engine, quota).pages, 1);
    engine.shutdown().unwrap();

    // Another set of prefixes: rule numbers may now mean other rules, so the pages are dropped.
    let mut other = c;
    other.rules = Arc::new(Rules::new(vec![rule("/new", Some(4), None, false)]).unwrap());
    let engine = start(other.clone());
    let stats = ShardStats::total(&block_on(engine.stats()).unwrap());
    assert_eq!(stats.pages, 0);
    assert!(stats.recovery_dropped > 0);
    put(&engine, PageKey::new(5, 0), 1);
    engine.shutdown().unwrap();
    // ...once: the new fingerprint is on disk, so the next start keeps them.
    let engine = start(other);
    assert_eq!(rule_stats(&engine, 1).pages, 1);
    assert_eq!(
        ShardStats::total(&block_on(engine.stats()).unwrap()).recovery_dropped,
        0
    );
}

#[test]
fn a_quota_with_nothing_evictable_refuses_and_bad_rules_do_not_start() {
    let dir = tempdir();
    let engine = start(cfg(dir.path(), vec![rule("/q", Some(2), None, false)]));
    let s = &engine.shards()[0];
    for p in 0..2 {
        put(&engine, PageKey::new(1, p), 1);
        assert!(block_on(s.set_pinned(PageKey::new(1, p), true)).unwrap());
    }
    let data = page_bytes(1, 2, 1, 100);
    match block_on(s.put_in_rule(PageKey::new(1, 2), data, 1, 1)) {
        Err(e @ EngineError::QuotaFull { .. }) => {
            assert!(e.to_string().contains("rule /q is at its quota"), "{e}")
        }
        other => panic!("expected QuotaFull, got {other:?}"),
    }
    assert_eq!(rule_stats(&engine, 1).quota_refusals, 1);
    engine.shutdown().unwrap();

    // A quota below one page per shard is a configuration error at start.
    let mut two = config(dir.path(), 2, PAGE, SLOTS);
    two.rules = Arc::new(Rules::new(vec![rule("/q", Some(1), None, false)]).unwrap());
    match Engine::start(two) {
        Err(StartError::Config(m)) => assert!(m.contains("rule /q") && m.contains("quota"), "{m}"),
        Err(e) => panic!("expected a configuration error, got {e}"),
        Ok(_) => panic!("expected a configuration error"),
    }
}
