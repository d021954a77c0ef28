//! Damage on disk is detected and never served: flipped bytes in page data, in slot headers, in
//! checksum tables and in the superblock, and a truncated cache file.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::{
    fs::OpenOptions,
    io::{Read, Seek, SeekFrom, Write},
    path::Path,
};

use common::*;
use pagestore_engine::{
    format::{HeaderState, SlotHeader, Superblock, HEADER_SIZE},
    shard_file, PageKey, ShardStats,
};

fn geometry(path: &Path) -> pagestore_engine::format::Geometry {
    let mut b = vec![0u8; 4096];
    std::fs::File::open(path)
        .unwrap()
        .read_exact(&mut b)
        .unwrap();
    Superblock::decode(&b).expect("valid superblock").geometry
}

/// Finds the slot holding `key` by reading the slot table (docs/FORMAT.md).
fn slot_of(path: &Path, key: PageKey) -> u32 {
    let g = geometry(path);
    let bytes = std::fs::read(path).unwrap();
    (0..g.nslots)
        .find(|&s| {
            let o = g.header_off(s) as usize;
            matches!(SlotHeader::decode(s, g.page_size, &bytes[o..o + HEADER_SIZE]), HeaderState::Valid(h) if h.key == key)
        })
        .expect("key on disk")
}

fn flip(path: &Path, offset: u64) {
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.read_exact(&mut b).unwrap();
    b[0] ^= 0x5a;
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(&b).unwrap();
    f.sync_all().unwrap();
}

const LEN: usize = 200_000;

fn fill(dir: &Path) -> pagestore_engine::EngineConfig {
    let cfg = config(dir, 1, 256 * KIB, 8);
    let engine = start(cfg.clone());
    block_on(async {
        for p in 0..4 {
            let k = PageKey::new(9, p);
            engine.shards()[0]
                .put(k, page_bytes(9, p, 1, LEN), 1)
                .await
                .unwrap();
        }
    });
    engine.shutdown().unwrap();
    cfg
}

#[test]
fn flipped_data_bytes_are_detected_on_read_and_the_page_is_dropped() {
    let dir = tempdir();
    let cfg = fill(dir.path());
    let path = shard_file(dir.path(), 0);
    let g = geometry(&path);
    let key = PageKey::new(9, 2);
    let slot = slot_of(&path, key);
    // Flip one byte in the page's 30th 4 KiB chunk.
    flip(&path, g.data_off(slot) + 29 * 4096 + 123);

    let engine = start(cfg);
    let s = &engine.shards()[0];
    block_on(async {
        // A range that does not touch the damaged chunk is still served (and is correct).
        assert_eq!(
            s.get(key, 0, 4096).await.unwrap().unwrap(),
            page_bytes(9, 2, 1, LEN)[..4096]
        );
        // A range that touches it is a miss, and the page is gone.
        assert_eq!(s.get(key, 29 * 4096, 10).await.unwrap(), None);
        assert!(!s.contains(key).await.unwrap());
        assert_eq!(s.get(key, 0, 10).await.unwrap(), None);
        let st = s.stats().await.unwrap();
        assert_eq!(st.checksum_failures, 1);
        // The other pages are untouched.
        for p in [0, 1, 3] {
            let k = PageKey::new(9, p);
            assert_eq!(
                s.get(k, 0, u32::MAX).await.unwrap().unwrap(),
                page_bytes(9, p, 1, LEN)
            );
        }
        // The slot is reusable and the key can be cached again.
        s.put(key, page_bytes(9, 2, 1, LEN), 1).await.unwrap();
        assert_eq!(
            s.get(key, 0, u32::MAX).await.unwrap().unwrap(),
            page_bytes(9, 2, 1, LEN)
        );
    });
}

#[test]
fn damaged_headers_and_checksum_tables_are_dropped_at_restart() {
    let dir = tempdir();
    let cfg = fill(dir.path());
    let path = shard_file(dir.path(), 0);
    let g = geometry(&path);
    let a = PageKey::new(9, 0);
    let b = PageKey::new(9, 1);
    flip(&path, g.header_off(slot_of(&path, a)) + 30); // inside the header
    flip(&path, g.table_off(slot_of(&path, b)) + 8); // inside the checksum table

    let engine = start(cfg);
    let s = &engine.shards()[0];
    block_on(async {
        let st: ShardStats = s.stats().await.unwrap();
        assert_eq!(st.recovered_pages, 2);
        assert_eq!(st.recovery_dropped, 2);
        assert_eq!(s.get(a, 0, 10).await.unwrap(), None);
        assert_eq!(s.get(b, 0, 10).await.unwrap(), None);
        for p in [2, 3] {
            let k = PageKey::new(9, p);
            assert_eq!(
                s.get(k, 0, u32::MAX).await.unwrap().unwrap(),
                page_bytes(9, p, 1, LEN)
            );
        }
    });
    drop(engine);
    // The damaged records were cleared on disk: a second restart finds nothing to drop.
    let engine = start(config(dir.path(), 1, 256 * KIB, 8));
    let st = block_on(engine.shards()[0].stats()).unwrap();
    assert_eq!((st.recovered_pages, st.recovery_dropped), (2, 0));
}

#[test]
fn a_damaged_superblock_or_truncated_file_is_rebuilt_empty() {
    for damage in ["superblock", "truncate"] {
        let dir = tempdir();
        let cfg = fill(dir.path());
        let path = shard_file(dir.path(), 0);
        match damage {
            "superblock" => flip(&path, 20),
            _ => {
                let g = geometry(&path);
                let f = OpenOptions::new().write(true).open(&path).unwrap();
                f.set_len(g.data_off + 3 * g.page_size as u64).unwrap();
            }
        }
        let engine = start(cfg);
        let s = &engine.shards()[0];
        block_on(async {
            assert_eq!(s.stats().await.unwrap().pages, 0, "{damage}");
            for p in 0..4 {
                assert_eq!(
                    s.get(PageKey::new(9, p), 0, 10).await.unwrap(),
                    None,
                    "{damage}"
                );
            }
            let k = PageKey::new(9, 0);
            s.put(k, page_bytes(9, 0, 1, LEN), 1).await.unwrap();
            assert_eq!(
                s.get(k, 0, u32::MAX).await.unwrap().unwrap(),
                page_bytes(9, 0, 1, LEN)
            );
        });
    }
}

#[test]
fn a_cache_of_another_format_version_is_refused_not_wiped() {
    let dir = tempdir();
    let cfg = fill(dir.path());
    let path = shard_file(dir.path(), 0);
    // Rewrite the superblock as a (future) version 2 with a valid checksum.
    let mut b = vec![0u8; 4096];
    std::fs::File::open(&path)
        .unwrap()
        .read_exact(&mut b)
        .unwrap();
    b[8..12].copy_from_slice(&2u32.to_le_bytes());
    let crc = crc32_ieee(&b[..4092]);
    b[4092..].copy_from_slice(&crc.to_le_bytes());
    let mut f = OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all(&b).unwrap();
    f.sync_all().unwrap();
    match pagestore_engine::Engine::start(cfg.clone()) {
        Err(pagestore_engine::StartError::Incompatible { reason, .. }) => {
            assert!(reason.contains("format version 2"), "{reason}");
        }
        Err(e) => panic!("expected Incompatible, got {e}"),
        Ok(_) => panic!("a version 2 cache was opened"),
    }
    // Untouched on disk: the first block is still the version 2 superblock.
    let mut again = vec![0u8; 4096];
    std::fs::File::open(&path)
        .unwrap()
        .read_exact(&mut again)
        .unwrap();
    assert_eq!(again, b);
    let engine = start(pagestore_engine::EngineConfig {
        reformat: true,
        ..cfg
    });
    assert_eq!(block_on(engine.shards()[0].stats()).unwrap().pages, 0);
}

/// crc32 (IEEE), bit by bit: an independent check of the superblock checksum rule.
fn crc32_ieee(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= byte as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}
