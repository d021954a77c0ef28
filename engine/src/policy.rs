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
mod tests;
