//! A cached page goes to quinn-proto without a copy: the `Bytes` a reply hands over point into
//! the DMA buffer the disk read filled, and release it on the shard's thread; a memory-tier hit
//! hands over a slice of the tier's entry.
#![allow(clippy::unwrap_used)]

mod common;

use pagestore_engine::{Engine, PageKey};
use pagestore_server::endpoint::Body;

#[test]
fn a_cached_page_is_handed_to_quic_from_its_disk_buffer() {
    let dir = common::tempdir();
    let engine = Engine::start(common::engine_config(dir.path(), 64 << 10, 8, 1)).unwrap();
    let key = PageKey::new(7, 0);
    let page: Vec<u8> = (0..64u32 << 10).map(|i| (i * 31 % 251) as u8).collect();
    let want = page[4096..4096 + 8192].to_vec();
    let same = futures_lite::future::block_on(engine.shards()[0].run(move |shard| async move {
        shard.put(&key, &page, 1).await.unwrap();
        let data = shard.get(&key, 4096, 8192).await.unwrap().unwrap();
        let disk_buffer = data.as_ptr();
        let bytes = Body::Page(data).into_bytes();
        let same = bytes.as_ptr() == disk_buffer && bytes[..] == want[..];
        // Clones share the buffer too; the last one releases it here, on the shard's thread.
        let clone = bytes.slice(100..200);
        drop(bytes);
        same && clone.len() == 100
    }))
    .unwrap();
    assert!(same, "the reply's bytes are the disk buffer's, byte-exact");

    // Owned bodies are taken over, not copied, as well.
    let v = vec![5u8; 1000];
    let p = v.as_ptr();
    assert_eq!(Body::Bytes(v).into_bytes().as_ptr(), p);
    engine.shutdown().unwrap();
}

/// A memory-tier hit goes out from the tier's own buffer: the reply's bytes are a slice of the
/// entry's `Bytes`, the same memory for every reader, never a copy.
#[test]
fn a_memory_tier_page_is_handed_to_quic_from_its_entry() {
    use pagestore_server::memory::{MemKey, MemoryTier};
    let mut tier = MemoryTier::new(1 << 20, 64 << 10);
    let key = MemKey {
        file_id: 7,
        page: 0,
        version: 3,
    };
    let page = bytes::Bytes::from(
        (0..64u32 << 10)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>(),
    );
    let entry = page.as_ptr();
    tier.offer_loaded(key, page);
    for reader in 0..3 {
        let held = tier.get(&key).unwrap();
        let body = Body::Shared(held.slice(4096..4096 + 8192)).into_bytes();
        assert_eq!(
            body.as_ptr(),
            entry.wrapping_add(4096),
            "reader {reader}: the reply is the entry's memory"
        );
        assert!(body
            .iter()
            .enumerate()
            .all(|(i, b)| *b == ((i + 4096) % 251) as u8));
    }
    assert_eq!(tier.stats().hits, 3);
}
