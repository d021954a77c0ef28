//! Intrusive doubly linked lists of slots over one slab: what both policies (and the index's
//! per-rule lists) are built on.

use slab::Slab;

use super::SlotId;

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
