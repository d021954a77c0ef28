//! Tests of `policy.rs` (a child module, kept apart so the code reads without them).
#![allow(clippy::unwrap_used)]

use super::*;
use proptest::prelude::*;
use std::collections::{BTreeSet, HashMap, VecDeque};

const N: u32 = 16;

#[derive(Clone, Debug)]
enum Op {
    Insert(SlotId),
    Access(SlotId),
    Remove(SlotId),
    Demote(SlotId),
    /// Evict with this busy bit mask over slots.
    Evict(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..N).prop_map(Op::Insert),
        3 => (0..N).prop_map(Op::Access),
        1 => (0..N).prop_map(Op::Remove),
        1 => (0..N).prop_map(Op::Demote),
        2 => any::<u16>().prop_map(Op::Evict),
    ]
}

fn is_busy(mask: u16, slot: SlotId) -> bool {
    mask & (1 << slot) != 0
}

/// Key hashes that collide in a few cases, to exercise the ghost queue.
fn hash_of(slot: SlotId) -> u64 {
    u64::from(slot % 5)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn lru_matches_model(ops in prop::collection::vec(op(), 1..120)) {
        let mut lru = Lru::new(N);
        // Front = most recently used (demoted: most recently demoted); the demoted go first.
        let mut model: VecDeque<SlotId> = VecDeque::new();
        let mut demoted: VecDeque<SlotId> = VecDeque::new();
        for op in ops {
            match op {
                Op::Insert(s) => {
                    lru.insert(s, hash_of(s));
                    model.retain(|&x| x != s);
                    demoted.retain(|&x| x != s);
                    model.push_front(s);
                }
                Op::Access(s) => {
                    lru.access(s);
                    let was = model.len() + demoted.len();
                    model.retain(|&x| x != s);
                    demoted.retain(|&x| x != s);
                    if model.len() + demoted.len() < was {
                        model.push_front(s);
                    }
                }
                Op::Remove(s) => {
                    lru.remove(s);
                    model.retain(|&x| x != s);
                    demoted.retain(|&x| x != s);
                }
                Op::Demote(s) => {
                    lru.demote(s);
                    if let Some(pos) = model.iter().position(|&x| x == s) {
                        model.remove(pos);
                        demoted.push_front(s);
                    }
                }
                Op::Evict(mask) => {
                    let got = lru.evict(&mut |s| is_busy(mask, s));
                    let want = match demoted.iter().rposition(|&s| !is_busy(mask, s)) {
                        Some(pos) => demoted.remove(pos),
                        None => model
                            .iter()
                            .rposition(|&s| !is_busy(mask, s))
                            .and_then(|pos| model.remove(pos)),
                    };
                    prop_assert_eq!(got, want);
                }
            }
            lru.list.check();
            prop_assert_eq!(lru.len(), model.len() + demoted.len());
            let order = |list: usize| {
                let mut v = Vec::new();
                let mut cur = lru.list.head(list);
                while let Some(s) = cur {
                    v.push(s);
                    cur = lru.list.older(s);
                }
                v
            };
            prop_assert_eq!(order(0), model.iter().copied().collect::<Vec<_>>());
            prop_assert_eq!(order(1), demoted.iter().copied().collect::<Vec<_>>());
        }
    }

    #[test]
    fn s3fifo_is_safe(ops in prop::collection::vec(op(), 1..150), nslots in 1u32..=N) {
        let mut p = S3Fifo::new(nslots);
        let mut tracked: BTreeSet<SlotId> = BTreeSet::new();
        for op in ops {
            match op {
                Op::Insert(s) => {
                    p.insert(s, hash_of(s));
                    tracked.insert(s);
                }
                Op::Access(s) => p.access(s),
                Op::Remove(s) => {
                    p.remove(s);
                    tracked.remove(&s);
                }
                Op::Demote(s) => p.demote(s),
                Op::Evict(mask) => {
                    let mut calls = 0;
                    let demoted = p.queues.len(2);
                    let was_demoted: BTreeSet<SlotId> =
                        (0..N).filter(|&s| p.queues.list_of(s) == Some(2)).collect();
                    let idle_demoted = was_demoted
                        .iter()
                        .any(|&s| p.queues.freq(s) == 0 && !is_busy(mask, s));
                    let got = p.evict(&mut |s| {
                        calls += 1;
                        is_busy(mask, s)
                    });
                    // Each demoted page once, then the two queues' bound.
                    prop_assert!(calls <= demoted + 4 * (tracked.len() + 1));
                    if idle_demoted {
                        prop_assert!(
                            got.is_some_and(|s| was_demoted.contains(&s)),
                            "a demoted page that is idle and unread goes first, not {:?}",
                            got
                        );
                    }
                    match got {
                        Some(s) => {
                            prop_assert!(tracked.remove(&s), "victim {} not tracked", s);
                            prop_assert!(!is_busy(mask, s), "victim {} is busy", s);
                        }
                        None => prop_assert!(
                            tracked.iter().all(|&s| is_busy(mask, s)),
                            "None although an idle slot is tracked"
                        ),
                    }
                }
            }
            p.queues.check();
            prop_assert_eq!(p.len(), tracked.len());
            prop_assert!(p.ghost.fifo.len() <= p.ghost.cap);
            for s in 0..N {
                prop_assert_eq!(p.contains(s), tracked.contains(&s));
            }
        }
        // With nothing busy, every tracked slot is eventually evicted.
        let mut evicted = BTreeSet::new();
        while let Some(s) = p.evict(&mut |_| false) {
            prop_assert!(evicted.insert(s));
        }
        prop_assert_eq!(evicted, tracked);
        prop_assert!(p.is_empty());
    }
}

fn all_policies(nslots: u32) -> Vec<Box<dyn EvictionPolicy>> {
    PolicyKind::ALL
        .iter()
        .map(|&k| new_policy(k, nslots))
        .collect()
}

#[test]
fn none_when_empty_or_all_busy() {
    for mut p in all_policies(100) {
        assert!(p.is_empty());
        assert_eq!(p.evict(&mut |_| false), None, "{}", p.name());
        for s in 0..100 {
            p.insert(s, u64::from(s));
            for _ in 0..(s % 5) {
                p.access(s);
            }
        }
        let mut calls = 0;
        assert_eq!(
            p.evict(&mut |_| {
                calls += 1;
                true
            }),
            None
        );
        assert!(calls <= 4 * 100 + 4, "{}: {calls} busy checks", p.name());
        assert_eq!(p.len(), 100);
        // Only slot 37 is idle: it must be found.
        assert_eq!(p.evict(&mut |s| s != 37), Some(37), "{}", p.name());
        assert_eq!(p.len(), 99);
        assert!(!p.contains(37));
    }
}

#[test]
fn remove_and_access_untracked_are_noops() {
    for mut p in all_policies(4) {
        p.remove(3);
        p.access(3);
        p.demote(3);
        p.demote(1000);
        p.access(1000);
        p.remove(1000);
        assert!(p.is_empty());
        p.insert(1, 7);
        p.insert(1, 7); // re-insert does not duplicate
        assert_eq!(p.len(), 1);
        assert_eq!(p.evict(&mut |_| false), Some(1));
        assert_eq!(p.evict(&mut |_| false), None);
    }
}

#[test]
fn demoted_pages_go_first_in_demotion_order_unless_busy_or_read_since() {
    for mut p in all_policies(100) {
        let name = p.name();
        for s in 0..10 {
            p.insert(s, u64::from(s));
            // Read often: the S3-FIFO keeps them in its main queue.
            for _ in 0..3 {
                p.access(s);
            }
        }
        // The newest pages, and the most read, demoted: they go first all the same.
        p.demote(9);
        p.demote(7);
        p.demote(8);
        p.demote(7); // demoted again: keeps its place
        assert_eq!(p.len(), 10, "{name}");
        assert_eq!(p.evict(&mut |_| false), Some(9), "{name}");
        // Busy: left for the next eviction, the next demoted one goes.
        assert_eq!(p.evict(&mut |s| s == 7), Some(8), "{name}");
        // Read since its demotion (a reader of the old version): kept as a page read once.
        p.access(7);
        let next = p.evict(&mut |_| false);
        assert!(next.is_some_and(|s| s < 7), "{name}: {next:?}");
        assert!(p.contains(7), "{name}");
        let mut rest = Vec::new();
        while let Some(s) = p.evict(&mut |_| false) {
            rest.push(s);
        }
        assert_eq!(rest.len(), 7, "{name}: {rest:?}");
        assert!(rest.contains(&7), "{name}: {rest:?}");
    }
}

#[test]
fn lru_order() {
    let mut p = Lru::new(8);
    for s in 0..4 {
        p.insert(s, 0);
    }
    p.access(0);
    // Order (old -> new): 1 2 3 0. Slot 1 busy: skip to 2, 1 stays put.
    assert_eq!(p.evict(&mut |s| s == 1), Some(2));
    assert_eq!(p.evict(&mut |_| false), Some(1));
    assert_eq!(p.evict(&mut |_| false), Some(3));
    assert_eq!(p.evict(&mut |_| false), Some(0));
}

#[test]
fn s3fifo_promotes_and_uses_ghost() {
    let mut p = S3Fifo::new(10); // small target 1
    p.insert(0, 100);
    p.insert(1, 101);
    p.insert(2, 102);
    p.access(0);
    p.access(0);
    // S = [2, 1, 0] (head first); 0 has freq 2 -> promoted to M; S is
    // still over target, so 1 (never read) is evicted into G.
    assert_eq!(p.evict(&mut |_| false), Some(1));
    assert_eq!(p.main_len(), 1);
    assert_eq!(p.small_len(), 1);
    assert_eq!(p.ghost_len(), 1);
    // Hash 101 is a ghost: the re-inserted page goes straight to M.
    p.insert(5, 101);
    assert_eq!(p.main_len(), 2);
    assert_eq!(p.ghost_len(), 0);
    // S is at target: M evicts FIFO, slot 0 (freq reset) first; a page
    // read in M gets another round.
    p.access(5);
    assert_eq!(p.evict(&mut |_| false), Some(0));
    assert_eq!(p.evict(&mut |_| false), Some(5));
    assert_eq!(p.evict(&mut |_| false), Some(2));
    assert!(p.is_empty());
}

#[test]
fn ghost_is_bounded() {
    let mut g = Ghost::new(3);
    for h in 0..10 {
        g.push(h);
    }
    assert_eq!(g.len(), 3);
    assert!(!g.take(6));
    assert!(g.take(7));
    g.push(8); // duplicate of a live hash
    assert!(g.fifo.len() <= 3);
    assert!(g.take(8));
    assert!(!g.take(8));
    assert!(g.len() <= 3);
}

#[test]
fn parse_and_display() {
    assert_eq!("lru".parse::<PolicyKind>(), Ok(PolicyKind::Lru));
    assert_eq!("LRU".parse::<PolicyKind>(), Ok(PolicyKind::Lru));
    assert_eq!("s3fifo".parse::<PolicyKind>(), Ok(PolicyKind::S3Fifo));
    assert_eq!("S3-FIFO".parse::<PolicyKind>(), Ok(PolicyKind::S3Fifo));
    let err = "arc".parse::<PolicyKind>().unwrap_err().to_string();
    assert!(err.contains("arc") && err.contains("lru") && err.contains("s3fifo"));
    for k in PolicyKind::ALL {
        assert_eq!(k.to_string().parse::<PolicyKind>(), Ok(k));
        assert_eq!(new_policy(k, 4).name(), k.to_string());
    }
    assert_eq!(PolicyKind::default(), PolicyKind::Lru);
}

/// A tiny cache driven by a policy: key -> slot, with free slots.
struct Sim {
    policy: Box<dyn EvictionPolicy>,
    map: HashMap<u64, SlotId>,
    key_in: Vec<Option<u64>>,
    free: Vec<SlotId>,
}

impl Sim {
    fn new(kind: PolicyKind, cap: u32) -> Self {
        Self {
            policy: new_policy(kind, cap),
            map: HashMap::new(),
            key_in: vec![None; cap as usize],
            free: (0..cap).rev().collect(),
        }
    }

    /// Reads `key`, caching it on a miss. Returns whether it hit.
    fn get(&mut self, key: u64) -> bool {
        if let Some(&slot) = self.map.get(&key) {
            self.policy.access(slot);
            return true;
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                let victim = self.policy.evict(&mut |_| false).unwrap();
                let old = self.key_in[victim as usize].take().unwrap();
                self.map.remove(&old);
                victim
            }
        };
        self.map.insert(key, slot);
        self.key_in[slot as usize] = Some(key);
        self.policy
            .insert(slot, key.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        false
    }
}

/// Returns (hot pages cached after the scan, hot hit ratio during it).
fn scan_run(kind: PolicyKind) -> (usize, f64) {
    const HOT: u64 = 200;
    let mut sim = Sim::new(kind, 1000);
    for _ in 0..5 {
        for k in 0..HOT {
            sim.get(k);
        }
    }
    let (mut hot_reads, mut hot_hits) = (0u32, 0u32);
    for i in 0..10_000u64 {
        sim.get(1_000_000 + i);
        if i % 5 == 4 {
            hot_reads += 1;
            if sim.get((i / 5) % HOT) {
                hot_hits += 1;
            }
        }
    }
    let kept = (0..HOT).filter(|k| sim.map.contains_key(k)).count();
    (kept, f64::from(hot_hits) / f64::from(hot_reads))
}

#[test]
fn s3fifo_resists_scans() {
    let (s3_kept, s3_hits) = scan_run(PolicyKind::S3Fifo);
    let (lru_kept, lru_hits) = scan_run(PolicyKind::Lru);
    println!("hot set kept after scan: s3fifo {s3_kept}/200, lru {lru_kept}/200");
    println!("hot hit ratio during scan: s3fifo {s3_hits:.3}, lru {lru_hits:.3}");
    assert!(s3_kept >= 180, "s3fifo kept only {s3_kept}");
    assert!(s3_kept > lru_kept);
    assert!(s3_hits >= 0.9);
    assert!(s3_hits > lru_hits + 0.2);
}
