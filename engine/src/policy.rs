//! Eviction policies for a shard's page slots.
//!
//! A policy tracks the slots that may be evicted (Ready, unpinned pages) and
//! picks a victim when the shard needs a slot. Two policies are provided, both
//! behind [`EvictionPolicy`]:
//!
//! * [`Lru`]: classic least-recently-used.
//! * [`S3Fifo`]: S3-FIFO (Yang et al., SOSP'23, "FIFO queues are all you
//!   need"), which resists one-pass scans.
//!
//! Both are pure state machines without I/O. They are built on [`SlotLists`],
//! a slab-backed intrusive doubly linked list, so every operation except
//! `evict` is O(1), and `access` never allocates.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::str::FromStr;

use slab::Slab;

/// Index of a page slot in a shard's cache file.
pub type SlotId = u32;

/// Chooses which cached page to evict when a shard runs out of free slots.
pub trait EvictionPolicy {
    /// Short name of the policy, e.g. `"lru"`.
    fn name(&self) -> &'static str;
    /// A page was just stored in `slot` (or restored at start-up, or
    /// unpinned); `key_hash` = `PageKey::hash64` (for ghost tracking).
    /// Inserting a slot that is already tracked re-inserts it as new.
    fn insert(&mut self, slot: SlotId, key_hash: u64);
    /// The page in `slot` was read (a hit). O(1), no allocation. A no-op for
    /// an untracked slot.
    fn access(&mut self, slot: SlotId);
    /// `slot` leaves the policy for a reason other than eviction (removed,
    /// pinned, dropped as corrupt). Calling it for an untracked slot is a
    /// no-op.
    fn remove(&mut self, slot: SlotId);
    /// Chooses and untracks a victim among tracked slots for which
    /// `busy(slot)` is false (busy = a read is in flight). `None` if every
    /// tracked slot is busy or none are tracked. Terminates in a bounded
    /// number of steps even if all are busy.
    fn evict(&mut self, busy: &mut dyn FnMut(SlotId) -> bool) -> Option<SlotId>;
    /// Whether `slot` is currently tracked.
    fn contains(&self, slot: SlotId) -> bool;
    /// Number of tracked slots.
    fn len(&self) -> usize;
    /// Whether no slot is tracked.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Which eviction policy to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PolicyKind {
    /// Least recently used.
    #[default]
    Lru,
    /// S3-FIFO: small + main FIFO queues with a ghost queue.
    S3Fifo,
}

impl PolicyKind {
    /// Every policy kind.
    pub const ALL: [PolicyKind; 2] = [PolicyKind::Lru, PolicyKind::S3Fifo];
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PolicyKind::Lru => "lru",
            PolicyKind::S3Fifo => "s3fifo",
        })
    }
}

/// Error returned when parsing an unknown [`PolicyKind`] name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsePolicyKindError {
    input: String,
}

impl fmt::Display for ParsePolicyKindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown eviction policy {:?}; valid values are \"lru\" and \"s3fifo\" (or \"s3-fifo\")",
            self.input
        )
    }
}

impl std::error::Error for ParsePolicyKindError {}

impl FromStr for PolicyKind {
    type Err = ParsePolicyKindError;

    /// Parses `"lru"`, `"s3fifo"` or `"s3-fifo"`, ignoring ASCII case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim();
        if name.eq_ignore_ascii_case("lru") {
            Ok(PolicyKind::Lru)
        } else if name.eq_ignore_ascii_case("s3fifo") || name.eq_ignore_ascii_case("s3-fifo") {
            Ok(PolicyKind::S3Fifo)
        } else {
            Err(ParsePolicyKindError {
                input: s.to_string(),
            })
        }
    }
}

/// Creates a policy of the given kind for a shard with `nslots` slots.
pub fn new_policy(kind: PolicyKind, nslots: u32) -> Box<dyn EvictionPolicy> {
    match kind {
        PolicyKind::Lru => Box::new(Lru::new(nslots)),
        PolicyKind::S3Fifo => Box::new(S3Fifo::new(nslots)),
    }
}

// ---------------------------------------------------------------------------
// Intrusive linked lists
// ---------------------------------------------------------------------------

/// "No node" marker for links.
const NIL: u32 = u32::MAX;

/// One tracked slot, linked into one of the lists of a [`SlotLists`].
#[derive(Clone, Copy, Debug)]
struct Node {
    slot: SlotId,
    /// Which list the node is in.
    list: u8,
    /// Access counter (used by S3-FIFO only).
    freq: u8,
    /// `PageKey::hash64` of the page (used by S3-FIFO only).
    key_hash: u64,
    /// Slab key of the neighbour toward the head, or `NIL`.
    prev: u32,
    /// Slab key of the neighbour toward the tail, or `NIL`.
    next: u32,
}

/// Head, tail and length of one list.
#[derive(Clone, Copy, Debug)]
struct Ends {
    head: u32,
    tail: u32,
    len: usize,
}

const EMPTY: Ends = Ends {
    head: NIL,
    tail: NIL,
    len: 0,
};

/// Number of lists a [`SlotLists::new`] holds.
const NLISTS: usize = 2;

/// Doubly linked lists of slots sharing one slab of nodes (two for the
/// policies; [`SlotLists::with_lists`] makes up to 256).
///
/// Each slot is in at most one list. Heads are the "new" end, tails the "old"
/// end. `node_of` maps a slot to its node, so finding, unlinking and moving a
/// slot are O(1). Capacity for `nslots` nodes is reserved up front.
#[derive(Debug)]
pub struct SlotLists {
    nodes: Slab<Node>,
    /// Slot -> slab key of its node, or `NIL` when the slot is not tracked.
    node_of: Vec<u32>,
    ends: Vec<Ends>,
}

impl SlotLists {
    /// Two empty lists for slots `0..nslots`.
    pub fn new(nslots: u32) -> Self {
        Self::with_lists(nslots, NLISTS)
    }

    /// `lists` empty lists (at most 256) for slots `0..nslots`.
    pub fn with_lists(nslots: u32, lists: usize) -> Self {
        debug_assert!(
            lists <= 256,
            "{lists} lists; a node records its list in a u8"
        );
        Self {
            nodes: Slab::with_capacity(nslots as usize),
            node_of: vec![NIL; nslots as usize],
            ends: vec![EMPTY; lists.min(256)],
        }
    }

    /// Number of slots in list `list`.
    pub fn len(&self, list: usize) -> usize {
        self.ends[list].len
    }

    /// Number of slots in all lists.
    pub fn total_len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether `slot` is in one of the lists.
    pub fn contains(&self, slot: SlotId) -> bool {
        self.key_of(slot).is_some()
    }

    /// The list `slot` is in, if any.
    pub fn list_of(&self, slot: SlotId) -> Option<usize> {
        self.key_of(slot).map(|k| usize::from(self.nodes[k].list))
    }

    /// The oldest slot of list `list`.
    pub fn tail(&self, list: usize) -> Option<SlotId> {
        self.slot_at(self.ends[list].tail)
    }

    /// The newest slot of list `list`.
    pub fn head(&self, list: usize) -> Option<SlotId> {
        self.slot_at(self.ends[list].head)
    }

    /// The slot one step toward the head from `slot` (newer), if any.
    pub fn newer(&self, slot: SlotId) -> Option<SlotId> {
        let key = self.key_of(slot)?;
        self.slot_at(self.nodes[key].prev)
    }

    /// The slot one step toward the tail from `slot` (older), if any.
    pub fn older(&self, slot: SlotId) -> Option<SlotId> {
        let key = self.key_of(slot)?;
        self.slot_at(self.nodes[key].next)
    }

    /// Adds an untracked `slot` at the head of `list`. If `slot` is already
    /// tracked it is first unlinked.
    pub fn push_front(&mut self, list: usize, slot: SlotId, key_hash: u64) {
        self.unlink(slot);
        let idx = slot as usize;
        if idx >= self.node_of.len() {
            // Only reached if a caller uses a slot beyond `nslots`.
            self.node_of.resize(idx + 1, NIL);
        }
        let key = self.nodes.insert(Node {
            slot,
            list: 0,
            freq: 0,
            key_hash,
            prev: NIL,
            next: NIL,
        });
        // Slab keys are < the number of slots, which is a u32.
        let key = key as u32;
        self.node_of[idx] = key;
        self.attach_front(list, key);
    }

    /// Removes `slot` from its list; returns its `(freq, key_hash)`, or
    /// `None` if it was not tracked.
    pub fn unlink(&mut self, slot: SlotId) -> Option<(u8, u64)> {
        let key = self.key_of(slot)?;
        self.detach(key as u32);
        self.node_of[slot as usize] = NIL;
        let node = self.nodes.remove(key);
        Some((node.freq, node.key_hash))
    }

    /// Moves a tracked `slot` to the head of `list` (which may be the list it
    /// is already in). A no-op for an untracked slot.
    pub fn move_to_front(&mut self, slot: SlotId, list: usize) {
        if let Some(key) = self.key_of(slot) {
            let key = key as u32;
            self.detach(key);
            self.attach_front(list, key);
        }
    }

    /// The access counter of `slot` (0 if untracked).
    pub fn freq(&self, slot: SlotId) -> u8 {
        self.key_of(slot).map_or(0, |k| self.nodes[k].freq)
    }

    /// Sets the access counter of a tracked `slot`.
    pub fn set_freq(&mut self, slot: SlotId, freq: u8) {
        if let Some(key) = self.key_of(slot) {
            self.nodes[key].freq = freq;
        }
    }

    fn key_of(&self, slot: SlotId) -> Option<usize> {
        match self.node_of.get(slot as usize) {
            Some(&key) if key != NIL => Some(key as usize),
            _ => None,
        }
    }

    fn slot_at(&self, key: u32) -> Option<SlotId> {
        if key == NIL {
            None
        } else {
            Some(self.nodes[key as usize].slot)
        }
    }

    /// Unhooks node `key` from its list, leaving it in the slab.
    fn detach(&mut self, key: u32) {
        let Node {
            list, prev, next, ..
        } = self.nodes[key as usize];
        let ends = &mut self.ends[usize::from(list)];
        if prev == NIL {
            ends.head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            ends.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
        ends.len -= 1;
    }

    /// Hooks a detached node `key` in at the head of `list`.
    fn attach_front(&mut self, list: usize, key: u32) {
        let ends = &mut self.ends[list];
        let old_head = ends.head;
        {
            let node = &mut self.nodes[key as usize];
            // At most 256 lists, so `list` fits a u8.
            node.list = list as u8;
            node.prev = NIL;
            node.next = old_head;
        }
        if old_head == NIL {
            ends.tail = key;
        } else {
            self.nodes[old_head as usize].prev = key;
        }
        ends.head = key;
        ends.len += 1;
    }

    /// Panics if links, lengths or the slot map are inconsistent.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut seen = 0;
        for (list, ends) in self.ends.iter().enumerate() {
            let mut prev = NIL;
            let mut cur = ends.head;
            let mut n = 0;
            while cur != NIL {
                let node = &self.nodes[cur as usize];
                assert_eq!(node.prev, prev, "broken prev link");
                assert_eq!(usize::from(node.list), list, "node in wrong list");
                assert_eq!(self.node_of[node.slot as usize], cur, "slot map mismatch");
                n += 1;
                assert!(n <= self.nodes.len(), "cycle in list");
                prev = cur;
                cur = node.next;
            }
            assert_eq!(ends.tail, prev, "broken tail");
            assert_eq!(ends.len, n, "wrong length");
            seen += n;
        }
        assert_eq!(seen, self.nodes.len(), "nodes outside every list");
        let mapped = self.node_of.iter().filter(|&&k| k != NIL).count();
        assert_eq!(mapped, self.nodes.len(), "slot map has stale entries");
    }
}

// ---------------------------------------------------------------------------
// LRU
// ---------------------------------------------------------------------------

/// Least-recently-used eviction: one list, most recent at the head.
#[derive(Debug)]
pub struct Lru {
    list: SlotLists,
}

impl Lru {
    /// An empty LRU for slots `0..nslots`.
    pub fn new(nslots: u32) -> Self {
        Self {
            list: SlotLists::new(nslots),
        }
    }
}

impl EvictionPolicy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn insert(&mut self, slot: SlotId, key_hash: u64) {
        self.list.push_front(0, slot, key_hash);
    }

    fn access(&mut self, slot: SlotId) {
        self.list.move_to_front(slot, 0);
    }

    fn remove(&mut self, slot: SlotId) {
        self.list.unlink(slot);
    }

    /// Scans from the tail toward the head and evicts the first slot that is
    /// not busy; busy slots keep their place.
    fn evict(&mut self, busy: &mut dyn FnMut(SlotId) -> bool) -> Option<SlotId> {
        let mut cur = self.list.tail(0);
        while let Some(slot) = cur {
            if !busy(slot) {
                self.list.unlink(slot);
                return Some(slot);
            }
            cur = self.list.newer(slot);
        }
        None
    }

    fn contains(&self, slot: SlotId) -> bool {
        self.list.contains(slot)
    }

    fn len(&self) -> usize {
        self.list.total_len()
    }
}

// ---------------------------------------------------------------------------
// S3-FIFO
// ---------------------------------------------------------------------------

/// List index of the small FIFO.
const SMALL: usize = 0;
/// List index of the main FIFO.
const MAIN: usize = 1;
/// Saturation value of the per-entry access counter.
const MAX_FREQ: u8 = 3;

/// S3-FIFO eviction (Yang et al., SOSP'23).
///
/// New pages enter a small FIFO `S` (about 10% of the slots). Pages evicted
/// from `S` that were read at least twice move to the main FIFO `M`; the
/// others are evicted and their key hash is remembered in a ghost FIFO `G`.
/// A page inserted while its hash is in `G` goes straight to `M`. `M` is
/// evicted in FIFO order, giving pages whose counter is non-zero another round
/// (decrementing the counter). One-pass scans therefore only churn `S`.
#[derive(Debug)]
pub struct S3Fifo {
    queues: SlotLists,
    small_target: usize,
    ghost: Ghost,
}

impl S3Fifo {
    /// An empty S3-FIFO for slots `0..nslots`.
    pub fn new(nslots: u32) -> Self {
        let nslots = nslots as usize;
        let small_target = (nslots / 10).max(1);
        let main_target = nslots.saturating_sub(small_target).max(1);
        Self {
            // `nslots` came from a u32.
            queues: SlotLists::new(nslots as u32),
            small_target,
            ghost: Ghost::new(main_target),
        }
    }

    /// Number of slots in the small queue.
    pub fn small_len(&self) -> usize {
        self.queues.len(SMALL)
    }

    /// Number of slots in the main queue.
    pub fn main_len(&self) -> usize {
        self.queues.len(MAIN)
    }

    /// Number of key hashes remembered in the ghost queue.
    pub fn ghost_len(&self) -> usize {
        self.ghost.len()
    }
}

impl EvictionPolicy for S3Fifo {
    fn name(&self) -> &'static str {
        "s3fifo"
    }

    fn insert(&mut self, slot: SlotId, key_hash: u64) {
        let list = if self.ghost.take(key_hash) {
            MAIN
        } else {
            SMALL
        };
        self.queues.push_front(list, slot, key_hash);
    }

    fn access(&mut self, slot: SlotId) {
        let freq = self.queues.freq(slot);
        if freq < MAX_FREQ {
            self.queues.set_freq(slot, freq + 1);
        }
    }

    fn remove(&mut self, slot: SlotId) {
        self.queues.unlink(slot);
    }

    fn evict(&mut self, busy: &mut dyn FnMut(SlotId) -> bool) -> Option<SlotId> {
        // Busy entries met in a row at the tail of each queue. Once a queue
        // has shown only busy entries for a full round it is skipped.
        let mut small_busy = 0;
        let mut main_busy = 0;
        // Each entry is looked at a bounded number of times (its counter is
        // at most 3), so this budget is never the reason for `None` when an
        // evictable slot exists; it only guarantees termination.
        let budget = 4 * self.len() + 4;
        for _ in 0..budget {
            let small_len = self.queues.len(SMALL);
            let main_len = self.queues.len(MAIN);
            let small_stuck = small_busy >= small_len;
            let main_stuck = main_busy >= main_len;
            let from_small = match (small_stuck, main_stuck) {
                (true, true) => return None,
                (true, false) => false,
                (false, true) => true,
                (false, false) => small_len > self.small_target || main_len == 0,
            };
            if from_small {
                let slot = self.queues.tail(SMALL)?;
                if busy(slot) {
                    small_busy += 1;
                    self.queues.move_to_front(slot, SMALL);
                } else if self.queues.freq(slot) > 1 {
                    small_busy = 0;
                    main_busy = 0;
                    self.queues.move_to_front(slot, MAIN);
                    self.queues.set_freq(slot, 0);
                } else {
                    let (_, key_hash) = self.queues.unlink(slot)?;
                    self.ghost.push(key_hash);
                    return Some(slot);
                }
            } else {
                let slot = self.queues.tail(MAIN)?;
                if busy(slot) {
                    main_busy += 1;
                    self.queues.move_to_front(slot, MAIN);
                } else {
                    main_busy = 0;
                    let freq = self.queues.freq(slot);
                    if freq > 0 {
                        self.queues.set_freq(slot, freq - 1);
                        self.queues.move_to_front(slot, MAIN);
                    } else {
                        self.queues.unlink(slot);
                        return Some(slot);
                    }
                }
            }
        }
        None
    }

    fn contains(&self, slot: SlotId) -> bool {
        self.queues.contains(slot)
    }

    fn len(&self) -> usize {
        self.queues.total_len()
    }
}

/// Bounded FIFO of key hashes of pages recently evicted from the small queue.
///
/// `fifo` holds `(hash, seq)` in insertion order; `live` maps each remembered
/// hash to the sequence number of its newest entry. Entries whose hash was
/// taken (or pushed again later) stay in `fifo` as stale entries until they
/// age out, so memory is bounded by `cap` entries.
#[derive(Debug)]
struct Ghost {
    fifo: VecDeque<(u64, u64)>,
    live: HashMap<u64, u64>,
    cap: usize,
    next_seq: u64,
}

impl Ghost {
    fn new(cap: usize) -> Self {
        Self {
            fifo: VecDeque::with_capacity(cap + 1),
            live: HashMap::with_capacity(cap + 1),
            cap,
            next_seq: 0,
        }
    }

    fn len(&self) -> usize {
        self.live.len()
    }

    /// Remembers `hash`, forgetting the oldest entry if full.
    fn push(&mut self, hash: u64) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.live.insert(hash, seq);
        self.fifo.push_back((hash, seq));
        while self.fifo.len() > self.cap {
            if let Some((old, old_seq)) = self.fifo.pop_front() {
                if self.live.get(&old) == Some(&old_seq) {
                    self.live.remove(&old);
                }
            }
        }
    }

    /// Forgets `hash`; returns whether it was remembered.
    fn take(&mut self, hash: u64) -> bool {
        self.live.remove(&hash).is_some()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    const N: u32 = 16;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(SlotId),
        Access(SlotId),
        Remove(SlotId),
        /// Evict with this busy bit mask over slots.
        Evict(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0..N).prop_map(Op::Insert),
            3 => (0..N).prop_map(Op::Access),
            1 => (0..N).prop_map(Op::Remove),
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
            // Front = most recently used.
            let mut model: VecDeque<SlotId> = VecDeque::new();
            for op in ops {
                match op {
                    Op::Insert(s) => {
                        lru.insert(s, hash_of(s));
                        model.retain(|&x| x != s);
                        model.push_front(s);
                    }
                    Op::Access(s) => {
                        lru.access(s);
                        if let Some(pos) = model.iter().position(|&x| x == s) {
                            model.remove(pos);
                            model.push_front(s);
                        }
                    }
                    Op::Remove(s) => {
                        lru.remove(s);
                        model.retain(|&x| x != s);
                    }
                    Op::Evict(mask) => {
                        let got = lru.evict(&mut |s| is_busy(mask, s));
                        let want = model.iter().rposition(|&s| !is_busy(mask, s));
                        let want = want.map(|pos| model.remove(pos).unwrap());
                        prop_assert_eq!(got, want);
                    }
                }
                lru.list.check();
                prop_assert_eq!(lru.len(), model.len());
                let order: Vec<SlotId> = {
                    let mut v = Vec::new();
                    let mut cur = lru.list.head(0);
                    while let Some(s) = cur {
                        v.push(s);
                        cur = lru.list.older(s);
                    }
                    v
                };
                prop_assert_eq!(order, model.iter().copied().collect::<Vec<_>>());
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
                    Op::Evict(mask) => {
                        let mut calls = 0;
                        let got = p.evict(&mut |s| {
                            calls += 1;
                            is_busy(mask, s)
                        });
                        prop_assert!(calls <= 4 * (tracked.len() + 1));
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
}
