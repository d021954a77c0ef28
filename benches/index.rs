//! The per-shard index and eviction policies, against a plain `HashMap<PageKey, u32>` (the
//! cheapest possible key -> slot map) measured in the same run.

#[path = "timing.rs"]
mod timing;

use std::{collections::HashMap, hint::black_box};

use pagestore_engine::{
    index::{Index, Lookup, PageMeta},
    policy::new_policy,
    PageKey, PolicyKind,
};
use timing::{ns_per_op, row, Rng};

const SLOTS: u32 = 250_000;

fn filled(kind: PolicyKind) -> (Index, Vec<PageKey>) {
    let mut idx = Index::new(SLOTS, new_policy(kind, SLOTS));
    let mut rng = Rng(7);
    let mut keys = Vec::with_capacity(SLOTS as usize);
    for _ in 0..SLOTS {
        let k = PageKey::new(rng.next_u64() as u128, rng.next_u64() % 4096);
        let r = idx.reserve().expect("free slot");
        let meta = PageMeta {
            len: 4 << 20,
            version: 1,
            inserted_ms: 0,
        };
        let _ = idx.commit(r.slot, k, meta, false);
        keys.push(k);
    }
    (idx, keys)
}

fn main() {
    println!("index: {SLOTS} pages indexed; operations on random keys");
    let mut rng = Rng(11);
    for kind in [PolicyKind::Lru, PolicyKind::S3Fifo] {
        let (mut idx, keys) = filled(kind);
        let map: HashMap<PageKey, u32> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (*k, i as u32))
            .collect();
        let lookups: Vec<PageKey> = (0..4096)
            .map(|_| keys[(rng.next_u64() % SLOTS as u64) as usize])
            .collect();

        let reference = ns_per_op(lookups.len() as u64, || {
            for k in &lookups {
                black_box(map.get(black_box(k)));
            }
        });
        let lookup = ns_per_op(lookups.len() as u64, || {
            for k in &lookups {
                black_box(idx.lookup(black_box(k)));
            }
        });
        row(
            &format!("{kind}: lookup"),
            lookup,
            "HashMap::get",
            reference,
        );

        // A hit as the shard does it: begin_read (lookup + policy access) and end_read.
        let hit = ns_per_op(lookups.len() as u64, || {
            for k in &lookups {
                if let Lookup::Hit(slot, _) = idx.begin_read(black_box(k), 0) {
                    idx.end_read(slot);
                }
            }
        });
        row(
            &format!("{kind}: hit (begin_read + end_read)"),
            hit,
            "HashMap::get",
            reference,
        );

        // A miss that inserts: evict a victim, publish a new key (the put path's index work).
        let mut next = 1u128 << 100;
        let insert = ns_per_op(1024, || {
            for _ in 0..1024 {
                next += 1;
                let r = idx.reserve().expect("evictable slot");
                if r.needs_clear {
                    // (the shard clears the old header on disk here)
                }
                let meta = PageMeta {
                    len: 4 << 20,
                    version: 1,
                    inserted_ms: 0,
                };
                black_box(idx.commit(r.slot, PageKey::new(next, 0), meta, false));
            }
        });
        let mut m2 = map.clone();
        let mut n2 = 1u128 << 101;
        let ref_insert = ns_per_op(1024, || {
            for _ in 0..1024 {
                n2 += 1;
                black_box(m2.insert(PageKey::new(n2, 0), 0));
            }
        });
        row(
            &format!("{kind}: evict + insert"),
            insert,
            "HashMap::insert",
            ref_insert,
        );
    }
}
