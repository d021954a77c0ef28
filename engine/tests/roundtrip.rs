//! Byte-exact puts and gets on real files: ranges, short last pages, replacement, removal, pins,
//! bad input, and concurrent access to one key.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use common::*;
use pagestore_engine::{EngineError, PageKey, PutOutcome};

#[test]
fn put_get_ranges_and_short_last_page() {
    let dir = tempdir();
    let page = 64 * KIB;
    let engine = start(config(dir.path(), 2, page, 16));
    block_on(async {
        // A file of 3.5 pages: three full pages and a short last one.
        let file = 0xABCD_u128;
        let sizes = [page as usize, page as usize, page as usize, 10_000];
        for (i, &len) in sizes.iter().enumerate() {
            let key = PageKey::new(file, i as u64);
            let data = page_bytes(file, i as u64, 1, len);
            let out = engine.shard_of(&key).put(key, data, 1).await.unwrap();
            assert_eq!(out, PutOutcome::Stored);
        }
        for (i, &len) in sizes.iter().enumerate() {
            let key = PageKey::new(file, i as u64);
            let want = page_bytes(file, i as u64, 1, len);
            let s = engine.shard_of(&key);
            assert_eq!(s.get(key, 0, u32::MAX).await.unwrap().unwrap(), want);
            // Ranges: unaligned, crossing chunk boundaries, single bytes, the tail.
            for (off, n) in [
                (0, 1),
                (1, 4095),
                (4095, 2),
                (4096, 4096),
                (5000, 30_000),
                (len as u32 - 1, 1),
                (len as u32 - 7, 100),
            ] {
                let got = s.get(key, off, n).await.unwrap().unwrap();
                let end = (off as usize + n as usize).min(len);
                assert_eq!(got, &want[off as usize..end], "page {i} range {off}+{n}");
            }
            // Offset == len: empty, not an error. Past the end: an error.
            assert_eq!(
                s.get(key, len as u32, 10).await.unwrap().unwrap(),
                Vec::<u8>::new()
            );
            match s.get(key, len as u32 + 1, 10).await {
                Err(EngineError::BadRange { offset, page_len }) => {
                    assert_eq!((offset, page_len), (len as u32 + 1, len as u32));
                }
                other => panic!("expected BadRange, got {other:?}"),
            }
        }
        // Unknown keys are misses.
        let missing = PageKey::new(file, 99);
        assert_eq!(
            engine.shard_of(&missing).get(missing, 0, 10).await.unwrap(),
            None
        );
        let stats = engine.stats().await.unwrap();
        let total = pagestore_engine::ShardStats::total(&stats);
        assert_eq!(total.pages, 4);
        assert_eq!(total.bytes, 3 * page as u64 + 10_000);
        assert_eq!(total.misses, 1);
        assert!(stats
            .iter()
            .all(|s| s.checksum_failures == 0 && s.io_errors == 0));
    });
}

#[test]
fn versions_replace_and_same_version_is_a_no_op() {
    let dir = tempdir();
    let engine = start(config(dir.path(), 1, 64 * KIB, 8));
    let s = &engine.shards()[0];
    block_on(async {
        let key = PageKey::new(7, 0);
        let v1 = page_bytes(7, 0, 1, 50_000);
        let v2 = page_bytes(7, 0, 2, 20_000);
        assert_eq!(s.put(key, v1.clone(), 1).await.unwrap(), PutOutcome::Stored);
        assert_eq!(
            s.put(key, v1.clone(), 1).await.unwrap(),
            PutOutcome::AlreadyPresent
        );
        assert_eq!(s.put(key, v2.clone(), 2).await.unwrap(), PutOutcome::Stored);
        assert_eq!(s.get(key, 0, u32::MAX).await.unwrap().unwrap(), v2);
        let info = s.page_info(key).await.unwrap().unwrap();
        assert_eq!((info.len, info.version, info.pinned), (20_000, 2, false));
        let st = s.stats().await.unwrap();
        assert_eq!((st.pages, st.inserts, st.bytes), (1, 2, 20_000));
    });
}

#[test]
fn remove_remove_file_and_pins() {
    let dir = tempdir();
    let engine = start(config(dir.path(), 1, 64 * KIB, 8));
    let s = &engine.shards()[0];
    block_on(async {
        for f in [1u128, 2] {
            for p in 0..3 {
                let k = PageKey::new(f, p);
                s.put(k, page_bytes(f, p, 1, 1000), 1).await.unwrap();
            }
        }
        assert!(s.remove(PageKey::new(1, 1)).await.unwrap());
        assert!(!s.remove(PageKey::new(1, 1)).await.unwrap());
        assert_eq!(s.get(PageKey::new(1, 1), 0, 10).await.unwrap(), None);
        assert_eq!(s.remove_file(2).await.unwrap(), 3);
        assert_eq!(s.stats().await.unwrap().pages, 2);
        assert!(s.set_pinned(PageKey::new(1, 0), true).await.unwrap());
        assert!(!s.set_pinned(PageKey::new(9, 0), true).await.unwrap());
        assert!(
            s.page_info(PageKey::new(1, 0))
                .await
                .unwrap()
                .unwrap()
                .pinned
        );
    });
}

#[test]
fn oversized_pages_are_refused() {
    let dir = tempdir();
    let engine = start(config(dir.path(), 1, 64 * KIB, 4));
    let s = &engine.shards()[0];
    let r = block_on(s.put(PageKey::new(1, 0), vec![0; 64 * 1024 + 1], 1));
    assert!(
        matches!(
            r,
            Err(EngineError::PageTooLarge {
                len: 65537,
                page_size: 65536
            })
        ),
        "{r:?}"
    );
    assert_eq!(block_on(s.stats()).unwrap().pages, 0);
}

#[test]
fn concurrent_put_and_get_of_one_key_never_show_partial_pages() {
    let dir = tempdir();
    let engine = start(config(dir.path(), 1, 1 << 20, 16));
    let s = engine.shards()[0].clone();
    let key = PageKey::new(5, 5);
    let data = page_bytes(5, 5, 1, 1 << 20);
    block_on(async {
        let s2 = s.clone();
        let d2 = data.clone();
        // Many puts of the same key race with many reads of it, all on the shard at once.
        let outcome = s
            .run(move |shard| async move {
                let mut puts = Vec::new();
                let mut gets = Vec::new();
                for _ in 0..8 {
                    let sh = shard.clone();
                    let d = d2.clone();
                    puts.push(glommio::spawn_local(async move {
                        sh.put(&key, &d, 1).await.unwrap()
                    }));
                    let sh = shard.clone();
                    gets.push(glommio::spawn_local(async move {
                        sh.get(&key, 0, u32::MAX).await.unwrap().map(|p| p.to_vec())
                    }));
                }
                let mut outs = Vec::new();
                for p in puts {
                    outs.push(p.await);
                }
                let mut seen = Vec::new();
                for g in gets {
                    seen.push(g.await);
                }
                (outs, seen)
            })
            .await
            .unwrap();
        let (outs, seen) = outcome;
        assert_eq!(
            outs.iter().filter(|o| **o == PutOutcome::Stored).count(),
            1,
            "{outs:?}"
        );
        for got in seen.into_iter().flatten() {
            assert!(got == data, "a reader saw a partial or wrong page");
        }
        let st = s2.stats().await.unwrap();
        assert_eq!(st.inserts, 1, "concurrent puts were not coalesced");
        assert_eq!(s2.get(key, 0, u32::MAX).await.unwrap().unwrap(), data);
    });
}

#[test]
fn replacing_pages_under_concurrent_reads_leaks_no_slots() {
    let dir = tempdir();
    let engine = start(config(dir.path(), 1, 64 * KIB, 8));
    let s = engine.shards()[0].clone();
    let key = PageKey::new(8, 0);
    block_on(async {
        s.run(move |shard| async move {
            shard
                .put(&key, &page_bytes(8, 0, 1, 40_000), 1)
                .await
                .unwrap();
            for v in 2..=40u64 {
                // Readers keep reading the current version while the next one is put, so some
                // read is in flight when the new copy is published.
                let done = std::rc::Rc::new(std::cell::Cell::new(false));
                let mut readers = Vec::new();
                for _ in 0..4 {
                    let sh = shard.clone();
                    let done = done.clone();
                    readers.push(glommio::spawn_local(async move {
                        let mut seen = Vec::new();
                        while !done.get() {
                            if let Some(p) = sh.get(&key, 0, u32::MAX).await.unwrap() {
                                seen.push(p.to_vec());
                            }
                        }
                        seen
                    }));
                }
                shard
                    .put(&key, &page_bytes(8, 0, v, 40_000), v)
                    .await
                    .unwrap();
                done.set(true);
                for r in readers {
                    for got in r.await {
                        let ok = got == page_bytes(8, 0, v - 1, 40_000)
                            || got == page_bytes(8, 0, v, 40_000);
                        assert!(ok, "a reader saw bytes of neither version");
                    }
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(
            s.get(key, 0, u32::MAX).await.unwrap().unwrap(),
            page_bytes(8, 0, 40, 40_000)
        );
        // Every slot is still usable: 8 new pages fit next to nothing else.
        s.remove(key).await.unwrap();
        for p in 0..8 {
            s.put(PageKey::new(9, p), vec![p as u8; 100], 1)
                .await
                .unwrap();
        }
        let st = s.stats().await.unwrap();
        assert_eq!(
            (st.slots, st.pages, st.evictions),
            (8, 8, 0),
            "slots leaked: {st:?}"
        );
    });
}

#[test]
fn put_buffer_stores_bytes_from_a_dma_buffer_without_a_copy() {
    let dir = tempdir();
    let engine = start(config(dir.path(), 1, 64 * KIB, 8));
    let s = &engine.shards()[0];
    let want = page_bytes(4, 0, 1, 10_000);
    let w = want.clone();
    let (stored, too_short) = block_on(s.run(move |shard| async move {
        let key = PageKey::new(4, 0);
        let mut buf = shard.alloc_buffer(w.len());
        assert_eq!(buf.len(), 12_288);
        buf.as_bytes_mut()[..w.len()].copy_from_slice(&w);
        // Bytes past `len` are not part of the page, whatever they hold.
        buf.as_bytes_mut()[w.len()..].fill(0xEE);
        let stored = shard.put_buffer(&key, buf, w.len(), 1).await.unwrap();
        let small = shard.alloc_buffer(100);
        let too_short = shard.put_buffer(&PageKey::new(4, 1), small, 5000, 1).await;
        (stored, too_short)
    }))
    .unwrap();
    assert_eq!(stored, PutOutcome::Stored);
    assert_5000_in_one_block_refused(&too_short);
    let got = block_on(s.get(PageKey::new(4, 0), 0, u32::MAX))
        .unwrap()
        .unwrap();
    assert_eq!(got, want);
    let info = block_on(s.page_info(PageKey::new(4, 0))).unwrap().unwrap();
    assert_eq!(info.len, 10_000);
}
