//! Least recently used.

use super::{EvictionPolicy, SlotId, SlotLists};

/// List index of the pages in use order.
const USED: usize = 0;
/// List index of the demoted pages, evicted first.
const DEMOTED: usize = 1;

/// Least-recently-used eviction: one list, most recent at the head, and the demoted pages
/// before it (oldest demotion at the tail).
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
        self.list.push_front(USED, slot, key_hash);
    }

    fn access(&mut self, slot: SlotId) {
        self.list.move_to_front(slot, USED);
    }

    fn remove(&mut self, slot: SlotId) {
        self.list.unlink(slot);
    }

    fn demote(&mut self, slot: SlotId) {
        if self.list.list_of(slot) != Some(DEMOTED) {
            self.list.move_to_front(slot, DEMOTED);
        }
    }

    /// Scans the demoted pages, then the others, each from the tail toward the head, and
    /// evicts the first slot that is not busy; busy slots keep their place.
    fn evict(&mut self, busy: &mut dyn FnMut(SlotId) -> bool) -> Option<SlotId> {
        for list in [DEMOTED, USED] {
            let mut cur = self.list.tail(list);
            while let Some(slot) = cur {
                if !busy(slot) {
                    self.list.unlink(slot);
                    return Some(slot);
                }
                cur = self.list.newer(slot);
            }
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
