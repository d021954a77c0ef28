//! Eviction at capacity on real files, under both policies, with pinned pages.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use common::*;
use pagestore_engine::{EngineConfig, EngineError, PageKey, PolicyKind};

const PAGE: u32 = 64 * KIB;

fn engine(dir: &std::path::Path, policy: PolicyKind) -> (pagestore_engine::Engine, u64) {
    let cfg = EngineConfig {
        policy,
        ..config(dir, 1, PAGE, 32)
    };
    let e = start(cfg);
    let slots = block_on(e.shards()[0].stats()).unwrap().slots;
    (e, slots)
}

#[test]
fn lru_keeps_the_most_recently_used_pages() {
    let dir = tempdir();
    let (engine, slots) = engine(dir.path(), PolicyKind::Lru);
    let s = &engine.shards()[0];
    block_on(async {
        let n = slots * 3;
        for p in 0..n {
            let k = PageKey::new(1, p);
            s.put(k, page_bytes(1, p, 1, 3000), 1).await.unwrap();
            // Keep page 0 hot: it must survive every eviction.
            assert!(
                s.get(PageKey::new(1, 0), 0, 10).await.unwrap().is_some(),
                "hot page evicted at {p}"
            );
        }
        let st = s.stats().await.unwrap();
        assert_eq!(st.pages, slots);
        assert_eq!(st.evictions, n - slots);
        // The survivors are the hot page and the newest slots-1 pages, byte-exact.
        for p in 0..n {
            let k = PageKey::new(1, p);
            let got = s.get(k, 0, u32::MAX).await.unwrap();
            let expect_present = p == 0 || p >= n - (slots - 1);
            assert_eq!(got.is_some(), expect_present, "page {p}");
            if let Some(g) = got {
                assert_eq!(g, page_bytes(1, p, 1, 3000));
            }
        }
    });
}

#[test]
fn s3fifo_survives_a_scan_that_flushes_lru() {
    // Hot set: a quarter of the cache, read often. Then a one-pass scan of 4x the cache with
    // occasional hot reads. S3-FIFO must keep (nearly) all of the hot set; LRU loses most of it.
    let mut kept = Vec::new();
    for policy in [PolicyKind::S3Fifo, PolicyKind::Lru] {
        let dir = tempdir();
        let (engine, slots) = engine(dir.path(), policy);
        let s = &engine.shards()[0];
        let hot = slots / 4;
        let survived = block_on(async {
            for p in 0..hot {
                s.put(PageKey::new(1, p), page_bytes(1, p, 1, 100), 1)
                    .await
                    .unwrap();
            }
            for _ in 0..3 {
                for p in 0..hot {
                    s.get(PageKey::new(1, p), 0, 1).await.unwrap();
                }
            }
            for i in 0..slots * 4 {
                s.put(PageKey::new(2, i), page_bytes(2, i, 1, 100), 1)
                    .await
                    .unwrap();
                if i % 4 == 0 {
                    let p = (i / 4) % hot;
                    s.get(PageKey::new(1, p), 0, 1).await.unwrap();
                }
            }
            let mut n = 0;
            for p in 0..hot {
                n += s.contains(PageKey::new(1, p)).await.unwrap() as u64;
            }
            n
        });
        kept.push((policy, survived, hot));
    }
    let (_, s3, hot) = kept[0];
    let (_, lru, _) = kept[1];
    assert!(
        s3 * 10 >= hot * 9,
        "S3-FIFO kept only {s3} of {hot} hot pages"
    );
    assert!(
        s3 > lru,
        "S3-FIFO ({s3}) should keep more of the hot set than LRU ({lru})"
    );
}

#[test]
fn pinned_pages_are_never_evicted_and_a_fully_pinned_shard_refuses_puts() {
    let dir = tempdir();
    let (engine, slots) = engine(dir.path(), PolicyKind::S3Fifo);
    let s = &engine.shards()[0];
    block_on(async {
        for p in 0..slots {
            let k = PageKey::new(3, p);
            s.put(k, page_bytes(3, p, 1, 500), 1).await.unwrap();
            if p % 2 == 0 {
                assert!(s.set_pinned(k, true).await.unwrap());
            }
        }
        for i in 0..slots * 3 {
            s.put(PageKey::new(4, i), page_bytes(4, i, 1, 500), 1)
                .await
                .unwrap();
        }
        for p in (0..slots).step_by(2) {
            let got = s.get(PageKey::new(3, p), 0, u32::MAX).await.unwrap();
            assert_eq!(got, Some(page_bytes(3, p, 1, 500)), "pinned page {p} lost");
        }
        // Pin everything that is left: now nothing can be evicted.
        for i in 0..slots * 3 {
            let _ = s.set_pinned(PageKey::new(4, i), true).await.unwrap();
        }
        for p in (1..slots).step_by(2) {
            let _ = s.set_pinned(PageKey::new(3, p), true).await.unwrap();
        }
        let r = s.put(PageKey::new(5, 0), vec![1; 10], 1).await;
        assert!(matches!(r, Err(EngineError::CacheFull)), "{r:?}");
        // Unpinning one page makes room again.
        assert!(s.set_pinned(PageKey::new(3, 0), false).await.unwrap());
        s.put(PageKey::new(5, 0), vec![1; 10], 1).await.unwrap();
        assert!(!s.contains(PageKey::new(3, 0)).await.unwrap());
    });
}
