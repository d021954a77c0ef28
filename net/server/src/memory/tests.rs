#![allow(clippy::unwrap_used)]

use super::*;
use proptest::prelude::*;

const PAGE: u32 = 1000;

fn key(file: u128, page: u64, version: u64) -> MemKey {
    MemKey {
        file_id: file,
        page,
        version,
    }
}

/// The bytes of a page at a version: different for every key.
fn bytes_of(k: &MemKey, len: usize) -> Bytes {
    let seed = k.hash();
    Bytes::from(
        (0..len)
            .map(|i| (seed.rotate_left(i as u32 % 64) as u8) ^ i as u8)
            .collect::<Vec<u8>>(),
    )
}

/// Bytes held, recounted from the entries.
fn recount(t: &MemoryTier) -> u64 {
    t.entries.values().map(|e| e.bytes.len() as u64).sum()
}

#[test]
fn a_loaded_page_is_served_at_its_version_only() {
    let mut t = MemoryTier::new(10 * u64::from(PAGE), PAGE);
    let k = key(7, 3, 11);
    let b = bytes_of(&k, PAGE as usize);
    t.offer_loaded(k, b.clone());
    let got = t.get(&k).unwrap();
    assert_eq!(got, b);
    // The same buffer, not a copy.
    assert_eq!(got.as_ptr(), b.as_ptr());
    assert!(t.get(&key(7, 3, 12)).is_none(), "another version");
    assert!(t.get(&key(7, 4, 11)).is_none(), "another page");
    let s = t.stats();
    assert_eq!((s.hits, s.admissions, s.pages, s.bytes), (1, 1, 1, 1000));
}

#[test]
fn a_disk_page_is_copied_in_on_its_second_read_only() {
    let mut t = MemoryTier::new(10 * u64::from(PAGE), PAGE);
    let k = key(1, 0, 1);
    assert!(!t.wants_from_disk(&k), "first read: remembered, not copied");
    assert!(!t.contains(&k));
    assert!(t.wants_from_disk(&k), "second read: copy it in");
    t.admit_copy(k, bytes_of(&k, 500));
    assert!(t.contains(&k));
    assert!(!t.wants_from_disk(&k), "held already");
    assert_eq!(t.stats().admissions, 1);
    // An off tier wants nothing.
    let mut off = MemoryTier::new(0, PAGE);
    assert!(!off.wants_from_disk(&k) && !off.wants_from_disk(&k));
    off.offer_loaded(k, bytes_of(&k, 10));
    assert!(off.get(&k).is_none());
}

#[test]
fn the_capacity_holds_and_pages_larger_than_the_tier_are_not_kept() {
    let mut t = MemoryTier::new(5 * u64::from(PAGE), PAGE);
    for p in 0..50 {
        let k = key(2, p, 1);
        t.offer_loaded(k, bytes_of(&k, PAGE as usize));
        assert!(t.stats().bytes <= 5 * u64::from(PAGE));
        assert_eq!(t.stats().bytes, recount(&t));
    }
    let s = t.stats();
    assert_eq!(s.admissions, 50);
    assert_eq!(s.evictions, 50 - s.pages);
    let big = key(3, 0, 1);
    t.offer_loaded(big, bytes_of(&big, 6 * PAGE as usize));
    assert!(!t.contains(&big));
}

#[test]
fn a_hot_set_survives_a_one_pass_scan() {
    // 20 pages of room; 8 hot pages read again and again; then a scan of 500 pages read once.
    let mut t = MemoryTier::new(20 * u64::from(PAGE), PAGE);
    let hot: Vec<MemKey> = (0..8).map(|p| key(9, p, 1)).collect();
    for k in &hot {
        t.offer_loaded(*k, bytes_of(k, PAGE as usize));
    }
    for _ in 0..3 {
        for k in &hot {
            assert!(t.get(k).is_some());
        }
    }
    for p in 0..500 {
        let k = key(10, p, 1);
        t.offer_loaded(k, bytes_of(&k, PAGE as usize));
        // Disk reads of the scan are remembered only.
        let d = key(11, p, 1);
        assert!(!t.wants_from_disk(&d));
        // The hot set keeps being read now and then.
        if p % 50 == 0 {
            for k in &hot {
                t.get(k);
            }
        }
    }
    for k in &hot {
        assert!(t.contains(k), "{k:?} was evicted by the scan");
    }
    assert!(t.stats().bytes <= 20 * u64::from(PAGE));
}

#[test]
fn removals_drop_every_version_and_their_bytes() {
    let mut t = MemoryTier::new(100 * u64::from(PAGE), PAGE);
    for (f, p, v) in [(1, 0, 1), (1, 0, 2), (1, 1, 1), (2, 0, 1), (2, 5, 9)] {
        let k = key(f, p, v);
        t.offer_loaded(k, bytes_of(&k, 100));
    }
    assert_eq!(t.remove_page(1, 0), 2);
    assert!(!t.contains(&key(1, 0, 1)) && !t.contains(&key(1, 0, 2)));
    assert!(t.contains(&key(1, 1, 1)));
    assert_eq!(t.remove_file(2), 2);
    assert_eq!(t.stats().pages, 1);
    assert_eq!(t.stats().bytes, 100);
    assert_eq!(recount(&t), 100);
    // Stale queue positions of removed pages do not disturb later eviction.
    for p in 0..300 {
        let k = key(4, p, 1);
        t.offer_loaded(k, bytes_of(&k, PAGE as usize));
    }
    assert_eq!(t.stats().bytes, recount(&t));
    assert!(t.small.len() + t.main.len() <= 2 * t.entries.len() + 64);
}

#[derive(Clone, Debug)]
enum Op {
    Loaded(u8, u8, u8, u16),
    Disk(u8, u8, u8, u16),
    Get(u8, u8, u8),
    RemovePage(u8, u8),
    RemoveFile(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..4, 0u8..16, 0u8..3, 1u16..=1000).prop_map(|(f, p, v, l)| Op::Loaded(f, p, v, l)),
        3 => (0u8..4, 0u8..16, 0u8..3, 1u16..=1000).prop_map(|(f, p, v, l)| Op::Disk(f, p, v, l)),
        4 => (0u8..4, 0u8..16, 0u8..3).prop_map(|(f, p, v)| Op::Get(f, p, v)),
        1 => (0u8..4, 0u8..16).prop_map(|(f, p)| Op::RemovePage(f, p)),
        1 => (0u8..4).prop_map(Op::RemoveFile),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever happens, the tier holds at most its capacity, its byte count is a recount, and
    /// a hit returns exactly the bytes admitted for that page at that version.
    #[test]
    fn prop_the_tier_is_bounded_and_serves_only_admitted_bytes(
        capacity in 0u64..8000,
        ops in proptest::collection::vec(op(), 1..300),
    ) {
        let mut t = MemoryTier::new(capacity, PAGE);
        // What was admitted last for each key (length of its bytes).
        let mut admitted: std::collections::HashMap<MemKey, usize> = Default::default();
        for op in ops {
            match op {
                Op::Loaded(f, p, v, len) => {
                    let k = key(f.into(), p.into(), v.into());
                    if !t.contains(&k) {
                        admitted.insert(k, len as usize);
                    }
                    t.offer_loaded(k, bytes_of(&k, len as usize));
                }
                Op::Disk(f, p, v, len) => {
                    let k = key(f.into(), p.into(), v.into());
                    if t.wants_from_disk(&k) {
                        admitted.insert(k, len as usize);
                        t.admit_copy(k, bytes_of(&k, len as usize));
                    }
                }
                Op::Get(f, p, v) => {
                    let k = key(f.into(), p.into(), v.into());
                    if let Some(b) = t.get(&k) {
                        let len = admitted[&k];
                        prop_assert_eq!(b, bytes_of(&k, len));
                    }
                }
                Op::RemovePage(f, p) => {
                    t.remove_page(f.into(), p.into());
                    for v in 0..3 {
                        prop_assert!(!t.contains(&key(f.into(), p.into(), v)));
                    }
                }
                Op::RemoveFile(f) => {
                    t.remove_file(f.into());
                    prop_assert!(t.entries.keys().all(|k| k.file_id != u128::from(f)));
                }
            }
            let s = t.stats();
            prop_assert!(s.bytes <= capacity);
            prop_assert_eq!(s.bytes, recount(&t));
            prop_assert_eq!(s.pages, t.entries.len() as u64);
            prop_assert!(t.ghost.order.len() <= t.ghost.limit);
        }
    }
}
