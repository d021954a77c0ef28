//! Tests of `index.rs` (a child module, kept apart so the code reads without them).
#![allow(clippy::unwrap_used)]

use super::*;
use crate::policy::{new_policy, PolicyKind};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

fn meta(len: u32, inserted_ms: u64) -> PageMeta {
    PageMeta {
        len,
        version: 1,
        inserted_ms,
    }
}

fn new_index(kind: PolicyKind, nslots: u32) -> Index {
    Index::new(nslots, new_policy(kind, nslots))
}

impl Index {
    /// `begin_read` without a clock, for indexes without TTL rules.
    fn read(&mut self, key: &PageKey) -> Option<(SlotId, PageMeta)> {
        match self.begin_read(key, 0) {
            Lookup::Hit(slot, meta) => Some((slot, meta)),
            Lookup::Miss => None,
            Lookup::Expired(r) => panic!("expired without a TTL rule: {r:?}"),
        }
    }
}

/// reserve + commit of an unmapped key; returns the slot.
fn put(idx: &mut Index, key: PageKey, len: u32) -> SlotId {
    let r = idx.reserve().unwrap();
    assert_eq!(idx.commit(r.slot, key, meta(len, 0), false), None);
    r.slot
}

#[test]
fn fresh_index() {
    let mut idx = new_index(PolicyKind::Lru, 4);
    idx.check_invariants();
    assert_eq!(idx.nslots(), 4);
    assert!(idx.is_empty());
    assert_eq!(idx.free_count(), 4);
    assert_eq!(idx.policy_name(), "lru");
    let r = idx.reserve().unwrap();
    assert_eq!(
        r,
        Reservation {
            slot: 0,
            needs_clear: false,
            evicted: None
        }
    );
    assert_eq!(idx.slot(0).state, SlotState::Filling);
    idx.check_invariants();
    let k = PageKey::new(1, 2);
    assert_eq!(idx.commit(0, k, meta(10, 0), false), None);
    idx.check_invariants();
    assert_eq!(idx.lookup(&k), Some(0));
    assert!(idx.contains(&k));
    assert_eq!(idx.len(), 1);
    assert_eq!(idx.bytes(), 10);
    assert_eq!(idx.keys().collect::<Vec<_>>(), vec![(&k, 0)]);
    assert_eq!(idx.read(&PageKey::new(1, 3)), None);
    assert_eq!(idx.read(&k), Some((0, meta(10, 0))));
    assert!(!idx.end_read(0));
    let s = idx.stats();
    assert_eq!((s.hits, s.misses), (1, 1));
}

#[test]
fn eviction_and_full() {
    let mut idx = new_index(PolicyKind::Lru, 2);
    let a = PageKey::new(1, 0);
    let b = PageKey::new(1, 1);
    put(&mut idx, a, 5);
    put(&mut idx, b, 7);
    // a is least recently used but being read, so b goes.
    idx.read(&a).unwrap();
    let r = idx.reserve().unwrap();
    assert_eq!(
        r,
        Reservation {
            slot: 1,
            needs_clear: true,
            evicted: Some(b)
        }
    );
    assert!(!idx.contains(&b));
    assert_eq!(idx.bytes(), 5);
    idx.check_invariants();
    // Only slot 0 is Ready, and it is busy: Full.
    assert_eq!(idx.reserve(), Err(ReserveError::Full));
    assert_eq!(idx.stats().full, 1);
    idx.abort(1, true);
    idx.check_invariants();
    assert_eq!(idx.slot(1).state, SlotState::Free);
    assert!(!idx.end_read(0));
    // Pinned pages are never evicted.
    assert_eq!(idx.set_pinned(&a, true), Some(0));
    let r = idx.reserve().unwrap();
    assert_eq!(r.slot, 1);
    assert!(r.needs_clear);
    idx.commit(1, b, meta(1, 0), true);
    assert_eq!(idx.reserve(), Err(ReserveError::Full));
    idx.check_invariants();
    assert_eq!(idx.set_pinned(&b, false), Some(1));
    assert_eq!(idx.reserve().unwrap().evicted, Some(b));
    assert!(ReserveError::Full.to_string().contains("pinned"));
}

#[test]
fn reserve_prefers_clean_free_slots() {
    let mut idx = new_index(PolicyKind::S3Fifo, 3);
    let rs: Vec<_> = (0..3).map(|_| idx.reserve().unwrap().slot).collect();
    assert_eq!(rs, vec![0, 1, 2]);
    idx.abort(0, true);
    idx.abort(1, false);
    idx.abort(2, true);
    idx.check_invariants();
    assert_eq!(idx.reserve().unwrap().slot, 1);
    let r = idx.reserve().unwrap();
    assert!(r.needs_clear);
    assert!(r.slot == 0 || r.slot == 2);
}

#[test]
fn displaced_commit_with_readers_in_flight() {
    for kind in PolicyKind::ALL {
        let mut idx = new_index(kind, 4);
        let k = PageKey::new(9, 1);
        let old = put(&mut idx, k, 100);
        let (slot, m) = idx.read(&k).unwrap();
        assert_eq!((slot, m.len), (old, 100));
        idx.read(&k).unwrap();
        let r = idx.reserve().unwrap();
        assert_eq!(idx.commit(r.slot, k, meta(50, 1), false), None);
        idx.check_invariants();
        assert_eq!(idx.lookup(&k), Some(r.slot));
        assert_eq!(idx.bytes(), 50);
        assert_eq!(idx.slot(old).state, SlotState::Doomed);
        assert_eq!(idx.stats().displaced, 1);
        assert!(!idx.end_read(old));
        assert!(idx.end_read(old));
        idx.reclaimed(old, true);
        idx.check_invariants();
        assert_eq!(idx.slot(old).state, SlotState::Free);
        assert!(!idx.slot(old).needs_clear);
        // Without readers the old slot comes back at once; pins survive.
        idx.set_pinned(&k, true);
        let cur = idx.lookup(&k).unwrap();
        let r = idx.reserve().unwrap();
        assert_eq!(idx.commit(r.slot, k, meta(1, 2), true), Some(cur));
        assert!(idx.slot(r.slot).pinned);
        idx.check_invariants();
        idx.reclaimed(cur, false);
        assert!(idx.slot(cur).needs_clear);
        idx.check_invariants();
    }
}

#[test]
fn restore_with_duplicates() {
    let mut idx = new_index(PolicyKind::Lru, 6);
    let k = PageKey::new(3, 3);
    let other = PageKey::new(3, 4);
    assert_eq!(idx.restore(4, k, meta(10, 100), false, 0), None);
    assert_eq!(idx.restore(2, other, meta(20, 100), true, 0), None);
    idx.check_invariants();
    // A newer copy wins; the older slot is returned Doomed.
    assert_eq!(idx.restore(1, k, meta(30, 200), false, 0), Some(4));
    assert_eq!(idx.slot(4).state, SlotState::Doomed);
    assert_eq!(idx.slot(4).readers, 0);
    assert_eq!(idx.lookup(&k), Some(1));
    assert_eq!(idx.bytes(), 50);
    idx.check_invariants();
    // An older copy (out of order) loses itself.
    assert_eq!(idx.restore(5, k, meta(40, 150), false, 0), Some(5));
    assert_eq!(idx.slot(5).state, SlotState::Doomed);
    assert_eq!(idx.lookup(&k), Some(1));
    idx.check_invariants();
    idx.reclaimed(4, true);
    idx.reclaimed(5, true);
    idx.check_invariants();
    assert!(idx.slot(2).pinned);
    assert_eq!(idx.len(), 2);
    // Remaining free slots: 0, 3, 4, 5.
    assert_eq!(idx.free_count(), 4);
    let mut got: Vec<_> = (0..4).map(|_| idx.reserve().unwrap().slot).collect();
    got.sort_unstable();
    assert_eq!(got, vec![0, 3, 4, 5]);
    // Only k (slot 1) is evictable; pinned `other` is not.
    assert_eq!(idx.reserve().unwrap().evicted, Some(k));
    assert_eq!(idx.reserve(), Err(ReserveError::Full));
}

#[test]
fn remove_and_remove_file() {
    let mut idx = new_index(PolicyKind::S3Fifo, 8);
    let mut slots = BTreeMap::new();
    for f in 1..=3u128 {
        for p in 0..2 {
            let k = PageKey::new(f, p);
            slots.insert(k, put(&mut idx, k, 1));
        }
    }
    let edge = PageKey::new(2, u64::MAX);
    slots.insert(edge, put(&mut idx, edge, 1));
    idx.read(&PageKey::new(2, 1)).unwrap();
    let (mut reclaim, deferred) = idx.remove_file(2);
    reclaim.sort_unstable();
    let mut want = vec![slots[&PageKey::new(2, 0)], slots[&edge]];
    want.sort_unstable();
    assert_eq!(reclaim, want);
    assert_eq!(deferred, 1);
    assert_eq!(idx.len(), 4);
    assert!(idx.keys().all(|(k, _)| k.file_id != 2));
    idx.check_invariants();
    for s in reclaim {
        idx.reclaimed(s, true);
    }
    let busy = slots[&PageKey::new(2, 1)];
    assert!(idx.end_read(busy));
    idx.reclaimed(busy, true);
    idx.check_invariants();
    assert_eq!(idx.remove_file(2), (vec![], 0));
    assert_eq!(idx.remove_file(7), (vec![], 0));

    let k = PageKey::new(1, 0);
    assert_eq!(idx.remove_if_slot(&k, slots[&k] + 1), Removal::NotFound);
    assert_eq!(
        idx.remove_if_slot(&k, slots[&k]),
        Removal::Reclaim(slots[&k])
    );
    assert_eq!(idx.remove(&k), Removal::NotFound);
    idx.reclaimed(slots[&k], true);
    let k = PageKey::new(3, 1);
    idx.read(&k).unwrap();
    assert_eq!(idx.remove(&k), Removal::Deferred(slots[&k]));
    assert_eq!(idx.read(&k), None);
    assert!(idx.end_read(slots[&k]));
    idx.reclaimed(slots[&k], false);
    idx.check_invariants();
    assert_eq!(idx.set_pinned(&k, true), None);
}

#[test]
fn a_demoted_file_is_evicted_before_any_other_page_but_held_pages_stay() {
    for kind in PolicyKind::ALL {
        let mut idx = new_index(kind, 8);
        // File 1, an old version: page 0 clean, page 1 pinned, page 2 dirty. File 2: the rest,
        // older than file 1's pages.
        let others: Vec<PageKey> = (0..5).map(|p| PageKey::new(2, p)).collect();
        for &k in &others {
            put(&mut idx, k, 1);
        }
        let (clean, pinned, dirty) = (PageKey::new(1, 0), PageKey::new(1, 1), PageKey::new(1, 2));
        for k in [clean, pinned, dirty] {
            put(&mut idx, k, 1);
            idx.read(&k).unwrap();
            let slot = idx.lookup(&k).unwrap();
            idx.end_read(slot);
        }
        idx.set_pinned(&pinned, true).unwrap();
        idx.set_dirty(&dirty, true).unwrap();
        assert_eq!(
            idx.demote_file(1),
            1,
            "{kind}: only the clean page, not the held ones"
        );
        assert_eq!(idx.demote_file(3), 0, "{kind}");
        idx.check_invariants();
        // Full: the next page takes the demoted page's slot, then another's, never a held one.
        let r = idx.reserve().unwrap();
        assert_eq!(r.evicted, Some(clean), "{kind}");
        idx.commit(r.slot, PageKey::new(3, 0), meta(1, 0), false);
        let r = idx.reserve().unwrap();
        assert!(r.evicted.is_some_and(|k| k.file_id == 2), "{kind}: {r:?}");
        assert!(idx.contains(&pinned) && idx.contains(&dirty), "{kind}");
        idx.check_invariants();
    }
}

// ---------------------------------------------------------------------
// Model-based property test
// ---------------------------------------------------------------------

const NSLOTS: u32 = 8;
const NKEYS: u64 = 24;
const NFILES: u64 = 3;

fn key(k: u64) -> PageKey {
    PageKey::new(u128::from(k % NFILES), k / NFILES)
}

#[derive(Clone, Debug)]
enum Op {
    /// reserve, then commit (outcome >= 2; a dirty page if outcome is 7) or
    /// abort (header needs clearing if outcome == 0).
    Put {
        key: u64,
        outcome: u8,
    },
    StartRead(u64),
    FinishRead(usize),
    /// A held read found a corrupt page: remove_if_slot.
    CorruptRead(usize),
    Remove(u64),
    RemoveFile(u64),
    DemoteFile(u64),
    Pin(u64),
    Unpin(u64),
    /// Pin the n-th present key (modulo), if any.
    PinNth(usize),
    /// Start a read of the n-th present key (modulo), if any.
    StartReadNth(usize),
    /// Mark the n-th present key (modulo) dirty or clean.
    DirtyNth(usize, bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..NKEYS, 0u8..8).prop_map(|(key, outcome)| Op::Put { key, outcome }),
        4 => (0..NKEYS).prop_map(Op::StartRead),
        3 => any::<usize>().prop_map(Op::FinishRead),
        1 => any::<usize>().prop_map(Op::CorruptRead),
        1 => (0..NKEYS).prop_map(Op::Remove),
        1 => (0..NFILES).prop_map(Op::RemoveFile),
        1 => (0..NFILES).prop_map(Op::DemoteFile),
        1 => (0..NKEYS).prop_map(Op::Pin),
        2 => any::<usize>().prop_map(Op::PinNth),
        2 => any::<usize>().prop_map(Op::StartReadNth),
        1 => (0..NKEYS).prop_map(Op::Unpin),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(n, d)| Op::DirtyNth(n, d)),
    ]
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    slot: SlotId,
    pinned: bool,
    dirty: bool,
    meta: PageMeta,
}

impl Entry {
    fn held(&self) -> bool {
        self.pinned || self.dirty
    }
}

/// The index under test plus a simple model of what it should hold.
struct Harness {
    idx: Index,
    lru: bool,
    present: BTreeMap<u64, Entry>,
    /// Reads in flight: (key, slot).
    readers: Vec<(u64, SlotId)>,
    /// Present keys neither pinned nor dirty, most recently used first.
    recency: VecDeque<u64>,
    /// Present keys demoted since (neither pinned nor dirty, nor read since), most recently
    /// demoted first: evicted before `recency`.
    demoted: VecDeque<u64>,
    step: u64,
}

impl Harness {
    fn new(kind: PolicyKind) -> Self {
        Self {
            idx: new_index(kind, NSLOTS),
            lru: kind == PolicyKind::Lru,
            present: BTreeMap::new(),
            readers: Vec::new(),
            recency: VecDeque::new(),
            demoted: VecDeque::new(),
            step: 0,
        }
    }

    fn busy(&self, slot: SlotId) -> bool {
        self.readers.iter().any(|&(_, s)| s == slot)
    }

    fn live(&self, k: u64, slot: SlotId) -> bool {
        self.present.get(&k).is_some_and(|e| e.slot == slot)
    }

    /// Slots Doomed while readers finish.
    fn doomed(&self) -> BTreeSet<SlotId> {
        self.readers
            .iter()
            .filter(|&&(k, s)| !self.live(k, s))
            .map(|&(_, s)| s)
            .collect()
    }

    fn forget(&mut self, k: u64) -> Option<Entry> {
        self.unrank(k);
        self.present.remove(&k)
    }

    /// `k` leaves the eviction order (to re-enter it at the head of `recency`, or not at all).
    fn unrank(&mut self, k: u64) {
        self.recency.retain(|&x| x != k);
        self.demoted.retain(|&x| x != k);
    }

    fn reclaim(&mut self, slot: SlotId, cleared: bool) {
        assert_eq!(self.idx.slot(slot).state, SlotState::Doomed);
        self.idx.reclaimed(slot, cleared);
        assert_eq!(self.idx.slot(slot).state, SlotState::Free);
        assert_eq!(self.idx.slot(slot).needs_clear, !cleared);
    }

    fn apply(&mut self, op: &Op, cleared: bool) {
        self.step += 1;
        let nth = |n: usize| {
            let len = self.present.len().max(1);
            self.present.keys().nth(n % len).copied().unwrap_or(0)
        };
        let op = match *op {
            Op::PinNth(n) => Op::Pin(nth(n)),
            Op::StartReadNth(n) => Op::StartRead(nth(n)),
            Op::DirtyNth(n, d) => {
                let k = nth(n);
                let got = self.idx.set_dirty(&key(k), d);
                let Some(e) = self.present.get_mut(&k) else {
                    assert_eq!(got, None);
                    return;
                };
                assert_eq!(got, Some(e.slot));
                if e.dirty != d {
                    e.dirty = d;
                    let held = e.held();
                    self.unrank(k);
                    if !held {
                        self.recency.push_front(k);
                    }
                }
                return;
            }
            ref other => other.clone(),
        };
        match op {
            Op::Put { key: k, outcome } => self.put(k, outcome, cleared),
            Op::StartRead(k) => {
                let got = self.idx.read(&key(k));
                match self.present.get(&k).copied() {
                    Some(e) => {
                        assert_eq!(got, Some((e.slot, e.meta)));
                        self.readers.push((k, e.slot));
                        if !e.held() {
                            self.unrank(k);
                            self.recency.push_front(k);
                        }
                    }
                    None => assert_eq!(got, None),
                }
            }
            Op::FinishRead(i) => {
                if self.readers.is_empty() {
                    return;
                }
                let (k, slot) = self.readers.swap_remove(i % self.readers.len());
                let want = !self.live(k, slot) && !self.busy(slot);
                assert_eq!(self.idx.end_read(slot), want);
                if want {
                    self.reclaim(slot, cleared);
                }
            }
            Op::CorruptRead(i) => {
                if self.readers.is_empty() {
                    return;
                }
                let (k, slot) = self.readers[i % self.readers.len()];
                let other = slot ^ 1;
                if !self.live(k, other) {
                    assert_eq!(self.idx.remove_if_slot(&key(k), other), Removal::NotFound);
                }
                let got = self.idx.remove_if_slot(&key(k), slot);
                if self.live(k, slot) {
                    assert_eq!(got, Removal::Deferred(slot));
                    self.forget(k);
                } else {
                    assert_eq!(got, Removal::NotFound);
                }
            }
            Op::Remove(k) => {
                let got = self.idx.remove(&key(k));
                match self.forget(k) {
                    None => assert_eq!(got, Removal::NotFound),
                    Some(e) if self.busy(e.slot) => assert_eq!(got, Removal::Deferred(e.slot)),
                    Some(e) => {
                        assert_eq!(got, Removal::Reclaim(e.slot));
                        self.reclaim(e.slot, cleared);
                    }
                }
            }
            Op::RemoveFile(f) => {
                let (mut got, deferred) = self.idx.remove_file(u128::from(f));
                let keys: Vec<u64> = self
                    .present
                    .keys()
                    .copied()
                    .filter(|k| k % NFILES == f)
                    .collect();
                let mut want = Vec::new();
                let mut want_deferred = 0;
                for k in keys {
                    let e = self.forget(k).unwrap();
                    if self.busy(e.slot) {
                        want_deferred += 1;
                    } else {
                        want.push(e.slot);
                    }
                }
                got.sort_unstable();
                want.sort_unstable();
                assert_eq!(got, want);
                assert_eq!(deferred, want_deferred);
                for slot in got {
                    self.reclaim(slot, cleared);
                }
            }
            Op::DemoteFile(f) => {
                let got = self.idx.demote_file(u128::from(f));
                let keys: Vec<u64> = self
                    .present
                    .iter()
                    .filter(|(k, e)| *k % NFILES == f && !e.held())
                    .map(|(k, _)| *k)
                    .collect();
                assert_eq!(got, keys.len());
                for k in keys {
                    if let Some(pos) = self.recency.iter().position(|&x| x == k) {
                        self.recency.remove(pos);
                        self.demoted.push_front(k);
                    }
                }
            }
            Op::PinNth(_) | Op::StartReadNth(_) | Op::DirtyNth(..) => unreachable!(),
            Op::Pin(k) | Op::Unpin(k) => {
                let pin = matches!(op, Op::Pin(_));
                let got = self.idx.set_pinned(&key(k), pin);
                let Some(e) = self.present.get_mut(&k) else {
                    assert_eq!(got, None);
                    return;
                };
                assert_eq!(got, Some(e.slot));
                if e.pinned != pin {
                    e.pinned = pin;
                    let held = e.held();
                    self.unrank(k);
                    if !held {
                        self.recency.push_front(k);
                    }
                }
            }
        }
    }

    fn put(&mut self, k: u64, outcome: u8, cleared: bool) {
        let free = NSLOTS as usize - self.present.len() - self.doomed().len();
        let clean_free = (0..NSLOTS)
            .any(|s| self.idx.slot(s).state == SlotState::Free && !self.idx.slot(s).needs_clear);
        let evictable = self
            .present
            .values()
            .any(|e| !e.held() && !self.busy(e.slot));
        let lru_victim = self
            .demoted
            .iter()
            .rev()
            .chain(self.recency.iter().rev())
            .copied()
            .find(|k| !self.busy(self.present[k].slot));
        let r = match self.idx.reserve() {
            Err(ReserveError::Full) => {
                assert!(free == 0 && !evictable, "Full with free={free}");
                return;
            }
            Err(e @ ReserveError::Quota { .. }) => panic!("no rules, yet {e}"),
            Ok(r) => r,
        };
        assert_eq!(self.idx.slot(r.slot).state, SlotState::Filling);
        match r.evicted {
            None => {
                assert!(free > 0, "got a free slot the model does not have");
                if clean_free {
                    assert!(!r.needs_clear, "dirty slot chosen over a clean one");
                }
            }
            Some(victim) => {
                assert_eq!(free, 0, "evicted although a slot was free");
                assert!(r.needs_clear);
                let vk = (0..NKEYS).find(|&x| key(x) == victim).unwrap();
                if self.lru {
                    assert_eq!(Some(vk), lru_victim, "LRU chose the wrong victim");
                }
                let e = self.forget(vk).expect("victim was present");
                assert!(!e.pinned, "evicted a pinned page");
                assert!(!e.dirty, "evicted a dirty page");
                assert!(!self.busy(e.slot), "evicted a page being read");
                assert_eq!(e.slot, r.slot);
            }
        }
        match outcome {
            0 | 1 => {
                let dirty = outcome == 0;
                self.idx.abort(r.slot, dirty);
                assert_eq!(self.idx.slot(r.slot).state, SlotState::Free);
                assert_eq!(self.idx.slot(r.slot).needs_clear, dirty);
            }
            _ => {
                let old = self.present.get(&k).copied();
                let pinned = old.is_some_and(|e| e.pinned);
                let dirty = outcome == 7;
                let m = PageMeta {
                    len: (k as u32) * 100 + u32::from(outcome),
                    version: self.step,
                    inserted_ms: self.step,
                };
                let got = self.idx.commit_with(r.slot, key(k), m, pinned, dirty);
                let want = old.map(|e| e.slot).filter(|&s| !self.busy(s));
                assert_eq!(got, want);
                self.forget(k);
                if let Some(s) = got {
                    self.reclaim(s, cleared);
                }
                self.present.insert(
                    k,
                    Entry {
                        slot: r.slot,
                        pinned,
                        dirty,
                        meta: m,
                    },
                );
                if !pinned && !dirty {
                    self.recency.push_front(k);
                }
            }
        }
    }

    fn check(&self) {
        self.idx.check_invariants();
        let want: BTreeMap<PageKey, SlotId> = self
            .present
            .iter()
            .map(|(&k, e)| (key(k), e.slot))
            .collect();
        let got: BTreeMap<PageKey, SlotId> = self.idx.keys().map(|(k, s)| (*k, s)).collect();
        assert_eq!(got, want);
        assert_eq!(self.idx.len(), self.present.len());
        let bytes: u64 = self.present.values().map(|e| u64::from(e.meta.len)).sum();
        assert_eq!(self.idx.bytes(), bytes);
        let doomed = self.doomed();
        for s in 0..NSLOTS {
            let info = self.idx.slot(s);
            let readers = self.readers.iter().filter(|&&(_, x)| x == s).count();
            assert_eq!(info.readers as usize, readers, "readers of slot {s}");
            let want_state = if doomed.contains(&s) {
                SlotState::Doomed
            } else if self.present.values().any(|e| e.slot == s) {
                SlotState::Ready
            } else {
                SlotState::Free
            };
            assert_eq!(info.state, want_state, "state of slot {s}");
        }
        for e in self.present.values() {
            let info = self.idx.slot(e.slot);
            assert_eq!(info.pinned, e.pinned);
            assert_eq!(info.dirty, e.dirty);
            assert_eq!(info.meta, e.meta);
        }
        let dirty: Vec<&Entry> = self.present.values().filter(|e| e.dirty).collect();
        assert_eq!(self.idx.dirty_pages() as usize, dirty.len());
        assert_eq!(
            self.idx.dirty_bytes(),
            dirty.iter().map(|e| u64::from(e.meta.len)).sum::<u64>()
        );
        assert_eq!(
            self.idx.free_count(),
            NSLOTS as usize - self.present.len() - doomed.len()
        );
    }
}

fn run(kind: PolicyKind, ops: &[(Op, bool)]) {
    let mut h = Harness::new(kind);
    for (op, cleared) in ops {
        h.apply(op, *cleared);
        h.check();
    }
    // Finish every read; everything Doomed gets reclaimed.
    while let Some((k, slot)) = h.readers.pop() {
        let want = !h.live(k, slot) && !h.busy(slot);
        assert_eq!(h.idx.end_read(slot), want);
        if want {
            h.reclaim(slot, true);
        }
        h.check();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn lru_index_matches_model(ops in prop::collection::vec((op(), any::<bool>()), 1..150)) {
        run(PolicyKind::Lru, &ops);
    }

    #[test]
    fn s3fifo_index_matches_model(ops in prop::collection::vec((op(), any::<bool>()), 1..150)) {
        run(PolicyKind::S3Fifo, &ops);
    }
}

// ---------------------------------------------------------------------
// Rules: quota, TTL, pin
// ---------------------------------------------------------------------

fn limits(quota: Option<u32>, ttl: Option<u64>, pin: bool) -> RuleLimits {
    RuleLimits {
        quota_pages: quota,
        ttl_ms: ttl,
        pin,
    }
}

fn ruled(nslots: u32, l: &[RuleLimits]) -> Index {
    let mut all = vec![RuleLimits::default()];
    all.extend_from_slice(l);
    Index::with_rules(nslots, new_policy(PolicyKind::Lru, nslots), &all)
}

/// reserve_for + commit at `now`; returns the reservation.
fn put_at(idx: &mut Index, key: PageKey, rule: u8, len: u32, now: u64) -> Reservation {
    let r = idx.reserve_for(rule).unwrap();
    let m = PageMeta {
        len,
        version: 1,
        inserted_ms: now,
    };
    assert_eq!(idx.commit(r.slot, key, m, false), None);
    idx.check_invariants();
    r
}

#[test]
fn a_rule_at_quota_evicts_its_own_oldest_page_first() {
    let mut idx = ruled(6, &[limits(Some(2), None, false)]);
    let (a, b, c) = (PageKey::new(1, 0), PageKey::new(1, 1), PageKey::new(1, 2));
    put_at(&mut idx, a, 1, 10, 0);
    put_at(&mut idx, PageKey::new(9, 0), 0, 5, 0);
    put_at(&mut idx, b, 1, 20, 0);
    // Free slots remain, but the rule is at its quota: its oldest page (a) goes.
    let r = put_at(&mut idx, c, 1, 30, 0);
    assert_eq!(r.evicted, Some(a));
    assert!(r.needs_clear);
    let st = idx.rule_stats(1);
    assert_eq!(
        (st.pages, st.bytes, st.quota_evictions, st.inserts),
        (2, 50, 1, 3)
    );
    assert_eq!(idx.rule_stats(0).pages, 1);
    assert_eq!(idx.stats().evictions, 1);
    // A read in flight protects b; c is taken instead.
    assert!(idx.read(&b).is_some());
    let r = put_at(&mut idx, PageKey::new(1, 3), 1, 1, 0);
    assert_eq!(r.evicted, Some(c));
    // Pinned by request and being read: nothing of the rule can go.
    idx.set_pinned(&PageKey::new(1, 3), true);
    assert_eq!(idx.reserve_for(1), Err(ReserveError::Quota { rule: 1 }));
    assert_eq!(idx.rule_stats(1).quota_refusals, 1);
    idx.check_invariants();
    // Other pages are unaffected by the rule's quota.
    put_at(&mut idx, PageKey::new(9, 1), 0, 5, 0);
    assert_eq!(idx.rule_stats(0).pages, 2);
    // An unknown rule number is no rule.
    put_at(&mut idx, PageKey::new(9, 2), 200, 5, 0);
    assert_eq!(idx.rule_stats(0).pages, 3);
    assert_eq!(idx.rule_stats(200), idx.rule_stats(0));
}

#[test]
fn expired_pages_are_misses_and_leave_the_index() {
    let mut idx = ruled(4, &[limits(None, Some(50), false)]);
    assert!(idx.has_ttl());
    let k = PageKey::new(1, 0);
    let r = put_at(&mut idx, k, 1, 10, 100);
    assert_eq!(idx.lookup_live(&k, 149), Some(r.slot));
    match idx.begin_read(&k, 149) {
        Lookup::Hit(slot, _) => assert!(!idx.end_read(slot)),
        other => panic!("{other:?}"),
    }
    assert_eq!(idx.lookup_live(&k, 150), None);
    assert!(idx.contains(&k));
    assert_eq!(
        idx.begin_read(&k, 150),
        Lookup::Expired(Removal::Reclaim(r.slot))
    );
    assert!(!idx.contains(&k));
    idx.reclaimed(r.slot, true);
    assert_eq!(idx.begin_read(&k, 150), Lookup::Miss);
    let st = idx.rule_stats(1);
    assert_eq!((st.pages, st.expirations), (0, 1));
    assert_eq!((idx.stats().hits, idx.stats().misses), (1, 2));
    // An expired page with a reader in flight is removed once the reader is done.
    let r = put_at(&mut idx, k, 1, 10, 200);
    let Lookup::Hit(slot, _) = idx.begin_read(&k, 200) else {
        panic!("hit expected")
    };
    assert_eq!(
        idx.begin_read(&k, 300),
        Lookup::Expired(Removal::Deferred(r.slot))
    );
    assert!(idx.end_read(slot));
    idx.reclaimed(slot, true);
    idx.check_invariants();
    // A clock that went backwards gives age 0, not an expiry.
    put_at(&mut idx, k, 1, 10, 1000);
    assert!(matches!(idx.begin_read(&k, 10), Lookup::Hit(..)));
}

#[test]
fn pin_rules_stop_at_the_cap_and_count_the_rest() {
    let mut idx = ruled(10, &[limits(None, None, true)]);
    assert_eq!(idx.pin_cap(), 9);
    for i in 0..10 {
        put_at(&mut idx, PageKey::new(1, i), 1, 100, 0);
    }
    let st = idx.rule_stats(1);
    assert_eq!((st.pages, st.pinned_pages, st.pinned_bytes), (10, 9, 900));
    assert_eq!(st.pins_refused, 1);
    // Only the page past the cap can be evicted, then nothing.
    let r = idx.reserve().unwrap();
    assert_eq!(r.evicted, Some(PageKey::new(1, 9)));
    assert_eq!(idx.rule_stats(1).evictions, 1);
    idx.abort(r.slot, true);
    idx.reserve().unwrap();
    assert_eq!(idx.reserve(), Err(ReserveError::Full));
    // Unpinning by request does not unpin what the rule pins.
    idx.set_pinned(&PageKey::new(1, 0), true);
    idx.set_pinned(&PageKey::new(1, 0), false);
    assert!(idx.slot(idx.lookup(&PageKey::new(1, 0)).unwrap()).held());
    idx.check_invariants();
}

#[test]
fn restore_reproduces_the_accounting_and_trims_lowered_quotas() {
    let l = [limits(Some(3), None, false), limits(None, Some(10), true)];
    let mut idx = ruled(8, &l);
    for i in 0..3 {
        put_at(&mut idx, PageKey::new(1, i), 1, 10 + i as u32, i);
    }
    for i in 0..2 {
        put_at(&mut idx, PageKey::new(2, i), 2, 7, 5);
    }
    put_at(&mut idx, PageKey::new(3, 0), 0, 1, 6);
    idx.set_pinned(&PageKey::new(3, 0), true);
    let pages: Vec<(SlotId, SlotInfo)> = idx.keys().map(|(_, s)| (s, *idx.slot(s))).collect();
    let replay = |l: &[RuleLimits]| {
        let mut fresh = ruled(8, l);
        let mut sorted = pages.clone();
        sorted.sort_by_key(|(s, i)| (i.meta.inserted_ms, *s));
        for (s, i) in &sorted {
            assert_eq!(fresh.restore(*s, i.key, i.meta, i.pinned, i.rule), None);
        }
        let trimmed = fresh.enforce_quotas();
        for s in &trimmed {
            fresh.reclaimed(*s, false);
        }
        fresh.check_invariants();
        (fresh, trimmed)
    };
    let (same, trimmed) = replay(&l);
    assert!(trimmed.is_empty());
    for r in 0..3 {
        let (a, b) = (idx.rule_stats(r), same.rule_stats(r));
        assert_eq!(
            (a.pages, a.bytes, a.pinned_pages, a.pinned_bytes),
            (b.pages, b.bytes, b.pinned_pages, b.pinned_bytes),
            "rule {r}"
        );
    }
    assert_eq!(same.pinned_pages(), idx.pinned_pages());
    // The quota lowered to 1 page: the two oldest pages of the rule go.
    let (low, trimmed) = replay(&[limits(Some(1), None, false), l[1]]);
    assert_eq!(trimmed.len(), 2);
    assert_eq!(low.rule_stats(1).pages, 1);
    assert_eq!(low.rule_stats(1).quota_evictions, 2);
    assert!(low.contains(&PageKey::new(1, 2)));
}

/// Rules of the property test: rule of key k is `k % 6`.
fn prop_limits() -> Vec<RuleLimits> {
    vec![
        RuleLimits::default(),
        limits(Some(3), None, false),
        limits(None, None, true),
        limits(None, Some(50), false),
        limits(Some(2), None, true),
        limits(Some(2), Some(30), false),
    ]
}

const RSLOTS: u32 = 6;
const RKEYS: u64 = 30;

#[derive(Clone, Debug)]
enum ROp {
    Put { key: u64, outcome: u8 },
    Read(u64),
    Finish(usize),
    Remove(u64),
    RemoveFile(u64),
    Pin(u64, bool),
    Advance(u64),
    Restart,
}

fn rop() -> impl Strategy<Value = ROp> {
    prop_oneof![
        8 => (0..RKEYS, 0u8..8).prop_map(|(key, outcome)| ROp::Put { key, outcome }),
        4 => (0..RKEYS).prop_map(ROp::Read),
        3 => any::<usize>().prop_map(ROp::Finish),
        1 => (0..RKEYS).prop_map(ROp::Remove),
        1 => (0..NFILES).prop_map(ROp::RemoveFile),
        2 => (0..RKEYS, any::<bool>()).prop_map(|(k, p)| ROp::Pin(k, p)),
        3 => (0u64..40).prop_map(ROp::Advance),
        1 => Just(ROp::Restart),
    ]
}

#[derive(Clone, Copy, Debug)]
struct RPage {
    slot: SlotId,
    pinned: bool,
    inserted: u64,
    /// When it (re-)entered its rule's list (insertion order).
    seq: u64,
}

struct RHarness {
    idx: Index,
    limits: Vec<RuleLimits>,
    present: BTreeMap<u64, RPage>,
    readers: Vec<(u64, SlotId)>,
    now: u64,
    seq: u64,
}

fn rule_of(k: u64) -> u8 {
    (k % 6) as u8
}

impl RHarness {
    fn busy(&self, slot: SlotId) -> bool {
        self.readers.iter().any(|&(_, s)| s == slot)
    }

    fn expired(&self, k: u64, p: &RPage) -> bool {
        self.limits[usize::from(rule_of(k))]
            .ttl_ms
            .is_some_and(|t| self.now.saturating_sub(p.inserted) >= t)
    }

    /// A removal the index reported: reclaim now, or leave it to the last reader.
    fn removed(&mut self, k: u64, got: Removal) {
        let p = self.present.remove(&k).expect("removed a present page");
        if self.busy(p.slot) {
            assert_eq!(got, Removal::Deferred(p.slot));
        } else {
            assert_eq!(got, Removal::Reclaim(p.slot));
            self.idx.reclaimed(p.slot, true);
        }
    }

    fn apply(&mut self, op: &ROp) {
        match *op {
            ROp::Put { key: k, outcome } => self.put(k, outcome),
            ROp::Read(k) => {
                let live = self.idx.lookup_live(&key(k), self.now);
                let got = self.idx.begin_read(&key(k), self.now);
                match self.present.get(&k).copied() {
                    None => assert_eq!(got, Lookup::Miss),
                    Some(p) if self.expired(k, &p) => {
                        assert_eq!(live, None);
                        assert!(matches!(got, Lookup::Expired(_)), "{got:?}");
                        let Lookup::Expired(r) = got else {
                            unreachable!()
                        };
                        self.removed(k, r);
                    }
                    Some(p) => {
                        assert_eq!(live, Some(p.slot));
                        assert!(matches!(got, Lookup::Hit(s, _) if s == p.slot), "{got:?}");
                        self.readers.push((k, p.slot));
                    }
                }
            }
            ROp::Finish(i) => {
                if self.readers.is_empty() {
                    return;
                }
                let (k, slot) = self.readers.swap_remove(i % self.readers.len());
                let live = self.present.get(&k).is_some_and(|p| p.slot == slot);
                let want = !live && !self.busy(slot);
                assert_eq!(self.idx.end_read(slot), want);
                if want {
                    self.idx.reclaimed(slot, true);
                }
            }
            ROp::Remove(k) => {
                let got = self.idx.remove(&key(k));
                if self.present.contains_key(&k) {
                    self.removed(k, got);
                } else {
                    assert_eq!(got, Removal::NotFound);
                }
            }
            ROp::RemoveFile(f) => {
                let (reclaim, _) = self.idx.remove_file(u128::from(f));
                for s in reclaim {
                    self.idx.reclaimed(s, true);
                }
                self.present.retain(|k, _| k % NFILES != f);
            }
            ROp::Pin(k, pin) => {
                let got = self.idx.set_pinned(&key(k), pin);
                self.seq += 1;
                let seq = self.seq;
                match self.present.get_mut(&k) {
                    None => assert_eq!(got, None),
                    Some(p) => {
                        assert_eq!(got, Some(p.slot));
                        if p.pinned && !pin {
                            p.seq = seq;
                        }
                        p.pinned = pin;
                    }
                }
            }
            ROp::Advance(ms) => self.now += ms,
            ROp::Restart => self.restart(),
        }
    }

    fn put(&mut self, k: u64, outcome: u8) {
        let rule = rule_of(k);
        let quota = self.limits[usize::from(rule)].quota_pages;
        let before: BTreeMap<PageKey, SlotInfo> = self
            .idx
            .keys()
            .map(|(k, s)| (*k, *self.idx.slot(s)))
            .collect();
        let r = match self.idx.reserve_for(rule) {
            Err(ReserveError::Full) => {
                let evictable = before.values().any(|i| !i.held() && !self.busy_slot(i));
                assert!(self.idx.free_count() == 0 && !evictable, "Full wrongly");
                return;
            }
            Err(ReserveError::Quota { rule: r }) => {
                assert_eq!(r, rule);
                let q = quota.expect("refused by a rule without a quota");
                let st = self.idx.rule_stats(rule);
                assert!(
                    st.pages + u64::from(self.idx.rules[usize::from(rule)].filling) >= u64::from(q)
                );
                let candidate = before
                    .values()
                    .any(|i| i.rule == rule && !i.pinned && !self.busy_slot(i));
                assert!(
                    !candidate,
                    "quota refusal with an evictable page of the rule"
                );
                return;
            }
            Ok(r) => r,
        };
        if let Some(victim) = r.evicted {
            let v = before[&victim];
            assert!(!v.pinned, "evicted a page pinned by request");
            assert_eq!(v.readers, 0, "evicted a page being read");
            let vk = (0..RKEYS).find(|&x| key(x) == victim).unwrap();
            let vp = self.present.remove(&vk).unwrap();
            let at_quota = quota.is_some_and(|q| {
                before.values().filter(|i| i.rule == rule).count() as u64 >= u64::from(q)
            });
            if at_quota {
                // The rule's own oldest evictable page.
                assert_eq!(v.rule, rule, "quota eviction took another rule's page");
                let oldest = self
                    .present
                    .iter()
                    .filter(|(x, p)| rule_of(**x) == rule && !p.pinned && !self.busy(p.slot))
                    .map(|(_, p)| p.seq)
                    .min();
                assert!(
                    oldest.is_none_or(|o| o > vp.seq),
                    "not the oldest of the rule"
                );
            } else {
                assert!(!v.rule_pinned, "the policy evicted a page its rule pins");
            }
        }
        if outcome < 2 {
            self.idx.abort(r.slot, outcome == 0);
            return;
        }
        let explicit = self.present.get(&k).is_some_and(|p| p.pinned);
        let m = PageMeta {
            len: 1 + k as u32 * 3 + u32::from(outcome),
            version: self.seq,
            inserted_ms: self.now,
        };
        if let Some(old) = self.idx.commit(r.slot, key(k), m, explicit) {
            self.idx.reclaimed(old, true);
        }
        self.seq += 1;
        self.present.insert(
            k,
            RPage {
                slot: r.slot,
                pinned: explicit,
                inserted: self.now,
                seq: self.seq,
            },
        );
        let info = *self.idx.slot(r.slot);
        let lim = self.limits[usize::from(rule)];
        if lim.pin && !info.rule_pinned {
            assert!(
                self.idx.pinned_pages() >= self.idx.pin_cap(),
                "pin refused below the cap"
            );
        }
        if info.rule_pinned && !explicit {
            assert!(
                self.idx.pinned_pages() <= self.idx.pin_cap(),
                "pinned past the cap"
            );
        }
    }

    fn busy_slot(&self, i: &SlotInfo) -> bool {
        i.readers > 0
    }

    /// A restart: a fresh index restored from the Ready pages (oldest first) must hold the
    /// same pages with the same accounting.
    fn restart(&mut self) {
        if !self.readers.is_empty() {
            return;
        }
        let mut pages: Vec<(SlotId, SlotInfo)> = self
            .idx
            .keys()
            .map(|(_, s)| (s, *self.idx.slot(s)))
            .collect();
        pages.sort_by_key(|(s, i)| (i.meta.inserted_ms, *s));
        let mut fresh =
            Index::with_rules(RSLOTS, new_policy(PolicyKind::Lru, RSLOTS), &self.limits);
        for (s, i) in &pages {
            assert_eq!(fresh.restore(*s, i.key, i.meta, i.pinned, i.rule), None);
        }
        assert!(
            fresh.enforce_quotas().is_empty(),
            "quota exceeded before the restart"
        );
        fresh.check_invariants();
        for r in 0..self.limits.len() as u8 {
            let (a, b) = (self.idx.rule_stats(r), fresh.rule_stats(r));
            assert_eq!((a.pages, a.bytes), (b.pages, b.bytes), "rule {r}");
        }
        // Pages restored in (inserted_ms, slot) order get that order in their rule lists.
        let order: Vec<SlotId> = pages.iter().map(|(s, _)| *s).collect();
        for p in self.present.values_mut() {
            let rank = order.iter().position(|&s| s == p.slot).unwrap() as u64;
            p.seq = rank;
        }
        self.seq = self.seq.max(order.len() as u64 + 1);
        self.idx = fresh;
    }

    fn check(&self) {
        self.idx.check_invariants();
        assert_eq!(self.idx.len(), self.present.len());
        for (r, l) in self.limits.iter().enumerate() {
            if let Some(q) = l.quota_pages {
                let st = self.idx.rule_stats(r as u8);
                let filling = self.idx.rules[r].filling;
                assert!(
                    st.pages + u64::from(filling) <= u64::from(q),
                    "rule {r} holds {} + {filling} pages, quota {q}",
                    st.pages
                );
            }
        }
        for (k, p) in &self.present {
            let i = self.idx.slot(p.slot);
            assert_eq!(i.key, key(*k));
            assert_eq!(i.pinned, p.pinned);
            assert_eq!(i.rule, rule_of(*k));
        }
    }
}

fn run_rules(ops: &[ROp]) {
    let limits = prop_limits();
    let mut h = RHarness {
        idx: Index::with_rules(RSLOTS, new_policy(PolicyKind::Lru, RSLOTS), &limits),
        limits,
        present: BTreeMap::new(),
        readers: Vec::new(),
        now: 1000,
        seq: 0,
    };
    for op in ops {
        h.apply(op);
        h.check();
    }
    while let Some((k, slot)) = h.readers.pop() {
        let live = h.present.get(&k).is_some_and(|p| p.slot == slot);
        let want = !live && !h.busy(slot);
        assert_eq!(h.idx.end_read(slot), want);
        if want {
            h.idx.reclaimed(slot, true);
        }
    }
    h.restart();
    h.check();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Quotas are never exceeded, held pages are never evicted by the policy, a quota
    /// evicts its rule's oldest page, expired pages are never served, the accounting
    /// equals a recount after every operation, and a restore reproduces it.
    #[test]
    fn rules_hold_under_any_operation_sequence(ops in prop::collection::vec(rop(), 1..200)) {
        run_rules(&ops);
    }
}
