//! S3-FIFO (Yang et al., SOSP'23): a small probationary FIFO, a main FIFO with reinsertion,
//! and a ghost queue of recently evicted slots; one-pass scans leave the main queue alone.

use std::collections::{HashMap, VecDeque};

use super::{EvictionPolicy, SlotId, SlotLists};

/// List index of the small FIFO.
const SMALL: usize = 0;
/// List index of the main FIFO.
const MAIN: usize = 1;
/// List index of the demoted pages, evicted before both.
const DEMOTED: usize = 2;
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
///
/// Demoted pages (a replaced version's) wait in a third FIFO that is evicted before
/// both, without a ghost entry; one read since its demotion sends a page to `S` instead,
/// as a page read once.
#[derive(Debug)]
pub struct S3Fifo {
    pub(super) queues: SlotLists,
    pub(super) small_target: usize,
    pub(super) ghost: Ghost,
}

impl S3Fifo {
    /// An empty S3-FIFO for slots `0..nslots`.
    pub fn new(nslots: u32) -> Self {
        let nslots = nslots as usize;
        let small_target = (nslots / 10).max(1);
        let main_target = nslots.saturating_sub(small_target).max(1);
        Self {
            // `nslots` came from a u32.
            queues: SlotLists::with_lists(nslots as u32, 3),
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

    fn demote(&mut self, slot: SlotId) {
        if self.queues.list_of(slot).is_some_and(|l| l != DEMOTED) {
            self.queues.move_to_front(slot, DEMOTED);
            self.queues.set_freq(slot, 0);
        }
    }

    fn evict(&mut self, busy: &mut dyn FnMut(SlotId) -> bool) -> Option<SlotId> {
        // Demoted pages first, each looked at once: a busy one keeps its turn for the next
        // eviction, one read since its demotion goes to the small queue as a page read once.
        for _ in 0..self.queues.len(DEMOTED) {
            let slot = self.queues.tail(DEMOTED)?;
            if busy(slot) {
                self.queues.move_to_front(slot, DEMOTED);
            } else if self.queues.freq(slot) > 0 {
                self.queues.move_to_front(slot, SMALL);
                self.queues.set_freq(slot, 1);
            } else {
                self.queues.unlink(slot);
                return Some(slot);
            }
        }
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
pub(super) struct Ghost {
    pub(super) fifo: VecDeque<(u64, u64)>,
    pub(super) live: HashMap<u64, u64>,
    pub(super) cap: usize,
    pub(super) next_seq: u64,
}

impl Ghost {
    pub(super) fn new(cap: usize) -> Self {
        Self {
            fifo: VecDeque::with_capacity(cap + 1),
            live: HashMap::with_capacity(cap + 1),
            cap,
            next_seq: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.live.len()
    }

    /// Remembers `hash`, forgetting the oldest entry if full.
    pub(super) fn push(&mut self, hash: u64) {
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
    pub(super) fn take(&mut self, hash: u64) -> bool {
        self.live.remove(&hash).is_some()
    }
}
