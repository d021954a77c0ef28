//! Least recently used.

use super::{EvictionPolicy, SlotId, SlotLists};

/// Least-recently-used eviction: one list, most recent at the head.
#[derive(Debug)]
pub struct Lru {
    pub(super) list: SlotLists,
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
