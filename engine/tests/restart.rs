//! Restart: every page comes back byte-exact without reading page data; settings that do not
//! match the files are refused with a clear error; one directory serves one process.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use common::*;
use pagestore_engine::{Engine, EngineConfig, PageKey, StartError};

#[test]
fn restart_restores_every_page_byte_exact() {
    let dir = tempdir();
    let cfg = config(dir.path(), 2, 64 * KIB, 40);
    let mut expected = Vec::new();
    {
        let engine = start(cfg.clone());
        block_on(async {
            for f in 0..5u128 {
                for p in 0..12u64 {
                    let len = if p == 11 { 777 } else { 64 * 1024 };
                    let k = PageKey::new(f, p);
                    engine
                        .shard_of(&k)
                        .put(k, page_bytes(f, p, 3, len), 3)
                        .await
                        .unwrap();
                    expected.push((k, len));
                }
            }
            let k = PageKey::new(0, 0);
            assert!(engine.shard_of(&k).set_pinned(k, true).await.unwrap());
            let gone = PageKey::new(1, 1);
            assert!(engine.shard_of(&gone).remove(gone).await.unwrap());
        });
        engine.shutdown().unwrap();
    }
    let engine = start(cfg);
    block_on(async {
        let stats = engine.stats().await.unwrap();
        let total = pagestore_engine::ShardStats::total(&stats);
        assert_eq!(total.recovered_pages, expected.len() as u64 - 1);
        assert_eq!(total.recovery_dropped, 0);
        for (k, len) in &expected {
            let got = engine.shard_of(k).get(*k, 0, u32::MAX).await.unwrap();
            if *k == PageKey::new(1, 1) {
                assert_eq!(got, None, "a removed page came back");
            } else {
                assert_eq!(
                    got,
                    Some(page_bytes(k.file_id, k.page_index, 3, *len)),
                    "{k}"
                );
            }
        }
        let k = PageKey::new(0, 0);
        assert!(
            engine
                .shard_of(&k)
                .page_info(k)
                .await
                .unwrap()
                .unwrap()
                .pinned
        );
        assert_eq!(
            engine
                .shard_of(&k)
                .page_info(k)
                .await
                .unwrap()
                .unwrap()
                .version,
            3
        );
    });
}

#[test]
fn changed_settings_are_refused_unless_reformat() {
    let dir = tempdir();
    let cfg = config(dir.path(), 1, 64 * KIB, 8);
    {
        let engine = start(cfg.clone());
        block_on(engine.shards()[0].put(PageKey::new(1, 0), vec![9; 100], 1)).unwrap();
    }
    let other = EngineConfig {
        page_size: 128 * 1024,
        ..cfg.clone()
    };
    match Engine::start(other.clone()) {
        Err(StartError::Incompatible { reason, .. }) => {
            assert!(reason.contains("page size"), "{reason}");
        }
        Err(e) => panic!("expected Incompatible, got {e}"),
        Ok(_) => panic!("expected Incompatible, engine started"),
    }
    // The refused start left the old cache intact.
    {
        let engine = start(cfg.clone());
        assert_eq!(
            block_on(engine.shards()[0].get(PageKey::new(1, 0), 0, 200)).unwrap(),
            Some(vec![9; 100])
        );
    }
    let engine = start(EngineConfig {
        reformat: true,
        ..other
    });
    let st = block_on(engine.shards()[0].stats()).unwrap();
    assert_eq!(st.pages, 0);
    assert_eq!(
        block_on(engine.shards()[0].get(PageKey::new(1, 0), 0, 200)).unwrap(),
        None
    );
}

#[test]
fn a_cache_directory_serves_one_process_at_a_time() {
    let dir = tempdir();
    let cfg = config(dir.path(), 1, 64 * KIB, 4);
    let engine = start(cfg.clone());
    match Engine::start(cfg.clone()) {
        Err(StartError::CacheInUse { .. }) => {}
        Err(e) => panic!("expected CacheInUse, got {e}"),
        Ok(_) => panic!("two engines opened one directory"),
    }
    drop(engine);
    start(cfg);
}

#[test]
fn bad_settings_give_clear_errors() {
    let dir = tempdir();
    let base = config(dir.path(), 1, 64 * KIB, 4);
    let cases = [
        EngineConfig {
            page_size: 3 << 20,
            ..base.clone()
        },
        EngineConfig {
            page_size: 32 << 10,
            ..base.clone()
        },
        EngineConfig {
            page_size: 128 << 20,
            ..base.clone()
        },
        EngineConfig {
            chunk_size: 1024,
            ..base.clone()
        },
        EngineConfig {
            cache_dirs: vec![],
            ..base.clone()
        },
        EngineConfig {
            capacity: 4096,
            ..base.clone()
        },
    ];
    for c in cases {
        match Engine::start(c.clone()) {
            Err(StartError::Config(m)) => assert!(!m.is_empty()),
            Err(e) => panic!("{c:?}: expected a configuration error, got {e}"),
            Ok(_) => panic!("{c:?}: started"),
        }
    }
}

#[test]
fn a_capacity_larger_than_the_disk_is_refused() {
    let dir = tempdir();
    let cfg = EngineConfig {
        capacity: 1 << 60,
        ..config(dir.path(), 1, 64 * KIB, 4)
    };
    match Engine::start(cfg) {
        Err(e @ StartError::NoSpace { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("not enough space"), "{msg}");
        }
        Err(e) => panic!("expected NoSpace, got {e}"),
        Ok(_) => panic!("an exabyte cache started"),
    }
}

/// A lock that another open file of `pagestore.lock` lets go of while a start waits (a process
/// forked elsewhere holds the descriptor until it execs) is taken: the start succeeds.
#[test]
fn a_lock_released_during_the_start_is_taken() {
    use std::os::fd::AsRawFd;
    let dir = tempdir();
    let cfg = config(dir.path(), 1, 64 * KIB, 4);
    drop(start(cfg.clone()));
    let other = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("pagestore.lock"))
        .unwrap();
    // SAFETY: flock on a descriptor this test owns.
    let held = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(held, 0);
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        drop(other);
    });
    let engine = Engine::start(cfg).expect("the lock, released after 100 ms, is taken");
    release.join().unwrap();
    drop(engine);
}
