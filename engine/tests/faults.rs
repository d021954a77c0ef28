//! Disk errors during operation (injected through the device seam): the failing request gets a
//! clear error, nothing is lost or half-published, and the shard keeps serving.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use common::*;
use pagestore_engine::{EngineError, PageKey};
use pagestore_testkit::faulty::{FaultConfig, FaultyDisk};

#[test]
fn enospc_and_eio_fail_the_request_and_the_shard_keeps_serving() {
    let dir = tempdir();
    let disk = FaultyDisk::new();
    let mut cfg = config(dir.path(), 1, 64 * KIB, 8);
    cfg.disk_hooks = Some(disk.clone());
    let engine = start(cfg);
    let s = &engine.shards()[0];
    block_on(async {
        let good = PageKey::new(1, 0);
        s.put(good, page_bytes(1, 0, 1, 30_000), 1).await.unwrap();

        // A put into a free slot makes three writes: data, checksum table, header. Fail each.
        for (errno, after) in [(libc::ENOSPC, 0), (libc::ENOSPC, 1), (libc::EIO, 2)] {
            disk.set(
                0,
                FaultConfig {
                    write_errno: Some(errno),
                    writes_before_failure: after,
                    read_errno: None,
                },
            );
            let k = PageKey::new(2, after);
            let r = s.put(k, page_bytes(2, after, 1, 30_000), 1).await;
            match &r {
                Err(e @ EngineError::Io { source, .. }) => {
                    assert_eq!(source.raw_os_error(), Some(errno), "{e}");
                }
                other => panic!("expected an I/O error, got {other:?}"),
            }
            // The failed page is not visible; the good one still is.
            assert_eq!(s.get(k, 0, 10).await.unwrap(), None);
            assert_eq!(
                s.get(good, 0, u32::MAX).await.unwrap().unwrap(),
                page_bytes(1, 0, 1, 30_000)
            );
        }
        disk.set(0, FaultConfig::default());
        let st = s.stats().await.unwrap();
        assert_eq!(st.io_errors, 3);
        assert_eq!(st.pages, 1);

        // Reads failing with EIO are errors, not wrong bytes, and not the end of the shard.
        disk.set(
            0,
            FaultConfig {
                read_errno: Some(libc::EIO),
                ..Default::default()
            },
        );
        assert!(matches!(
            s.get(good, 0, 10).await,
            Err(EngineError::Io { .. })
        ));
        disk.set(0, FaultConfig::default());

        // Once the disk recovers, every slot is usable again (slots of failed puts were freed).
        let slots = s.stats().await.unwrap().slots;
        for p in 0..slots {
            let k = PageKey::new(3, p);
            s.put(k, page_bytes(3, p, 1, 1000), 1).await.unwrap();
        }
        for p in 0..slots {
            let k = PageKey::new(3, p);
            assert_eq!(
                s.get(k, 0, u32::MAX).await.unwrap().unwrap(),
                page_bytes(3, p, 1, 1000)
            );
        }
    });
}

#[test]
fn pages_written_before_a_failed_put_survive_restart() {
    let dir = tempdir();
    let disk = FaultyDisk::new();
    let mut cfg = config(dir.path(), 1, 64 * KIB, 8);
    cfg.disk_hooks = Some(disk.clone());
    {
        let engine = start(cfg.clone());
        let s = &engine.shards()[0];
        block_on(async {
            for p in 0..8 {
                s.put(PageKey::new(1, p), page_bytes(1, p, 1, 5000), 1)
                    .await
                    .unwrap();
            }
            // Full cache: the next put must evict, and the disk fails midway through it.
            disk.set(
                0,
                FaultConfig {
                    write_errno: Some(libc::EIO),
                    writes_before_failure: 1,
                    read_errno: None,
                },
            );
            assert!(s.put(PageKey::new(2, 0), vec![1; 5000], 1).await.is_err());
        });
    }
    // The disk recovers: the engine restarts on a healthy one.
    disk.set(0, FaultConfig::default());
    let engine = start(cfg);
    let s = &engine.shards()[0];
    block_on(async {
        assert_eq!(s.get(PageKey::new(2, 0), 0, 10).await.unwrap(), None);
        let mut present = 0;
        for p in 0..8 {
            if let Some(got) = s.get(PageKey::new(1, p), 0, u32::MAX).await.unwrap() {
                assert_eq!(got, page_bytes(1, p, 1, 5000));
                present += 1;
            }
        }
        // Exactly the evicted page is gone.
        assert_eq!(present, 7);
    });
}
