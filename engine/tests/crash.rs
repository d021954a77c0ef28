//! Crash consistency: a child process writes, replaces and removes pages as fast as it can and is
//! SIGKILLed at random moments, over and over. After every kill the cache must open and every
//! page it returns must be exactly the bytes of the version its header names. Pages may be lost
//! (they were in flight); wrong bytes never.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::*;
use pagestore_engine::{EngineConfig, PageKey, ShardStats};

const ENV: &str = "PAGESTORE_CRASH_CHILD_DIR";
const PAGE: u32 = 256 * KIB;
const FILES: u128 = 4;
const PAGES: u64 = 12;

fn cfg(dir: &std::path::Path) -> EngineConfig {
    // Fewer slots than keys, so the child also evicts all the time.
    config(dir, 2, PAGE, 16)
}

fn len_for(f: u128, p: u64, v: u64) -> usize {
    match (f as u64 * 31 + p * 7 + v * 13) % 4 {
        0 => 1 + ((f as u64 * 977 + p * 131 + v * 7919) % PAGE as u64) as usize,
        _ => PAGE as usize,
    }
}

/// The child's workload (runs only when spawned by `crash_consistency_under_sigkill`).
#[test]
#[ignore = "helper process for crash_consistency_under_sigkill"]
fn crash_child() {
    let Ok(dir) = std::env::var(ENV) else { return };
    let engine = start(cfg(std::path::Path::new(&dir)));
    let seed = std::process::id() as u64 * 0x9E37_79B9 + 1;
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let engine = &engine;
            scope.spawn(move || {
                let mut rng = Rng::new(seed + t * 7919);
                loop {
                    let f = (rng.next_u64() % FILES as u64) as u128;
                    let p = rng.next_u64() % PAGES;
                    let v = 1 + rng.next_u64() % 5;
                    let k = PageKey::new(f, p);
                    let s = engine.shard_of(&k);
                    let r = if rng.next_u64() % 10 == 0 {
                        block_on(s.remove(k)).map(|_| ())
                    } else {
                        block_on(s.put(k, page_bytes(f, p, v, len_for(f, p, v)), v)).map(|_| ())
                    };
                    if let Err(e) = r {
                        // CacheFull can happen when every slot is busy; anything else is a bug.
                        assert!(matches!(e, pagestore_engine::EngineError::CacheFull), "{e}");
                    }
                }
            });
        }
    });
}

#[test]
fn crash_consistency_under_sigkill() {
    let dir = tempdir();
    let exe = std::env::current_exe().unwrap();
    let mut rng = Rng::new(0x1234_5678 ^ Instant::now().elapsed().as_nanos() as u64 | 1);
    let mut seen_pages = 0u64;
    for round in 0..24 {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash_child",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ENV, dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(150 + rng.next_u64() % 400));
        assert!(
            child.try_wait().unwrap().is_none(),
            "round {round}: child exited early"
        );
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();

        let engine = start(cfg(dir.path()));
        block_on(async {
            let mut present = 0;
            for f in 0..FILES {
                for p in 0..PAGES {
                    let k = PageKey::new(f, p);
                    let s = engine.shard_of(&k);
                    let Some(info) = s.page_info(k).await.unwrap() else {
                        continue;
                    };
                    let v = info.version;
                    let want = page_bytes(f, p, v, len_for(f, p, v));
                    assert_eq!(info.len as usize, want.len(), "round {round} {k}: length");
                    // None: torn by the kill, detected and dropped. Never wrong bytes.
                    if let Some(got) = s.get(k, 0, u32::MAX).await.unwrap() {
                        assert!(got == want, "round {round} {k}: wrong bytes served");
                        present += 1;
                    }
                }
            }
            let total = ShardStats::total(&engine.stats().await.unwrap());
            assert_eq!(
                total.pages, present,
                "round {round}: every indexed page must be readable or dropped"
            );
            seen_pages += present;
        });
        engine.shutdown().unwrap();
    }
    assert!(seen_pages > 0, "the child never got a page written");
}
