//! A randomised workload against a model: puts of changing versions, range reads, removals,
//! file removals, pins and restarts, in a cache much smaller than the key space. Whatever was
//! evicted may be missing, but every byte returned must be the last version put, a removed page
//! never returns (not even after a restart), and a pinned page is always there.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::collections::{HashMap, HashSet};

use common::*;
use pagestore_engine::{EngineConfig, PageKey, PolicyKind};

const PAGE: u32 = 64 * KIB;

fn len_of(f: u128, p: u64, v: u64) -> usize {
    1 + ((f as u64 * 7919 + p * 104_729 + v * 1_299_709) % PAGE as u64) as usize
}

fn run(seed: u64, policy: PolicyKind) {
    let dir = tempdir();
    let cfg = EngineConfig {
        policy,
        ..config(dir.path(), 1, PAGE, 12)
    };
    let mut engine = start(cfg.clone());
    let mut rng = Rng::new(seed | 1);
    // Model: the last version put per key (None after a removal), and the pinned keys.
    let mut last: HashMap<PageKey, Option<u64>> = HashMap::new();
    let mut pinned: HashSet<PageKey> = HashSet::new();
    let mut version = 0u64;
    let (mut hits, mut checked) = (0, 0);
    for step in 0..2500 {
        let k = PageKey::new(rng.below(4) as u128, rng.below(10));
        let s = engine.shards()[0].clone();
        match rng.below(100) {
            0..=34 => {
                version += 1;
                let data = page_bytes(
                    k.file_id,
                    k.page_index,
                    version,
                    len_of(k.file_id, k.page_index, version),
                );
                match block_on(s.put(k, data, version)) {
                    Ok(_) => {
                        last.insert(k, Some(version));
                    }
                    // Every slot pinned: allowed, nothing changed.
                    Err(pagestore_engine::EngineError::CacheFull) => {}
                    Err(e) => panic!("step {step}: put failed: {e}"),
                }
            }
            35..=74 => {
                let (off, len) = (
                    rng.below(PAGE as u64) as u32,
                    rng.below(PAGE as u64 + 1) as u32,
                );
                let got = block_on(s.get(k, off, len));
                checked += 1;
                match (got, last.get(&k).copied().flatten()) {
                    (Ok(Some(bytes)), Some(v)) => {
                        let want = page_bytes(
                            k.file_id,
                            k.page_index,
                            v,
                            len_of(k.file_id, k.page_index, v),
                        );
                        let end = (off as usize + len as usize).min(want.len());
                        assert!(
                            bytes == want[off as usize..end],
                            "step {step}: {k} returned bytes of the wrong version"
                        );
                        hits += 1;
                    }
                    (Ok(Some(_)), None) => {
                        panic!("step {step}: {k} was removed or never put, yet served")
                    }
                    (Ok(None), _) => {
                        assert!(!pinned.contains(&k), "step {step}: pinned page {k} missing");
                    }
                    (Err(pagestore_engine::EngineError::BadRange { .. }), Some(v)) => {
                        assert!(
                            off as usize > len_of(k.file_id, k.page_index, v),
                            "step {step}: bad BadRange"
                        );
                    }
                    (Err(e), _) => panic!("step {step}: get failed: {e}"),
                }
            }
            75..=82 => {
                block_on(s.remove(k)).unwrap();
                last.insert(k, None);
                pinned.remove(&k);
            }
            83..=85 => {
                block_on(s.remove_file(k.file_id)).unwrap();
                for (kk, v) in last.iter_mut() {
                    if kk.file_id == k.file_id {
                        *v = None;
                    }
                }
                pinned.retain(|kk| kk.file_id != k.file_id);
            }
            86..=91 => {
                // Pin at most a third of the cache, so puts can still find room.
                if pinned.len() < 4 && block_on(s.set_pinned(k, true)).unwrap() {
                    pinned.insert(k);
                }
            }
            92..=96 => {
                if block_on(s.set_pinned(k, false)).unwrap() {
                    pinned.remove(&k);
                }
            }
            _ => {
                engine.shutdown().unwrap();
                engine = start(cfg.clone());
                // Pins survive the restart; every pinned page is still there.
                for p in &pinned {
                    let info = block_on(engine.shards()[0].page_info(*p)).unwrap();
                    assert!(
                        info.is_some_and(|i| i.pinned),
                        "step {step}: pin of {p} lost in restart"
                    );
                }
            }
        }
    }
    let st = block_on(engine.shards()[0].stats()).unwrap();
    assert_eq!(st.checksum_failures, 0);
    assert!(
        hits > 50 && checked > 500,
        "workload too thin: {hits} hits of {checked} reads"
    );
}

#[test]
fn random_workload_with_restarts_lru() {
    for seed in [1, 7, 42] {
        run(seed, PolicyKind::Lru);
    }
}

#[test]
fn random_workload_with_restarts_s3fifo() {
    for seed in [3, 11, 99] {
        run(seed, PolicyKind::S3Fifo);
    }
}
