//! Per-shard page index: which page lives in which slot, and the lifecycle of
//! every slot. Pure state machine, no I/O.
//!
//! A shard's cache file has `nslots` fixed page slots. The I/O layer calls
//! into [`Index`] and does the disk writes between calls. Slot lifecycle:
//!
//! ```text
//!   Free --reserve--> Filling --commit--> Ready --remove/displace--> Doomed
//!    ^                   |                  |                          |
//!    |                   +------abort-------|--------------------------+
//!    |                                      |                          |
//!    +----------------(evicted by reserve: Ready -> Filling)           |
//!    +-------------------------------reclaimed-------------------------+
//! ```
//!
//! * `Free`: unused. `needs_clear` says whether its on-disk header may still
//!   describe a valid page (then the I/O layer must clear it before reuse).
//! * `Filling`: reserved for a put; the data is being written.
//! * `Ready`: published in the map and readable.
//! * `Doomed`: gone from the map; waits for in-flight readers to finish and
//!   for the I/O layer to clear the on-disk header, then `reclaimed` frees it.

use std::collections::BTreeMap;
use std::fmt;

use crate::key::PageKey;
use crate::policy::{EvictionPolicy, SlotId};

/// Metadata of a stored page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageMeta {
    /// Length of the page data in bytes.
    pub len: u32,
    /// Version of the page as given by the writer.
    pub version: u64,
    /// When the page was stored (milliseconds, caller's clock).
    pub inserted_ms: u64,
}

impl PageMeta {
    const ZERO: PageMeta = PageMeta {
        len: 0,
        version: 0,
        inserted_ms: 0,
    };
}

/// Lifecycle state of a slot; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// Unused.
    Free,
    /// Reserved for a put whose data is being written.
    Filling,
    /// Published and readable.
    Ready,
    /// Removed from the map; waiting for readers and a header clear.
    Doomed,
}

/// Everything the index knows about one slot.
#[derive(Clone, Copy, Debug)]
pub struct SlotInfo {
    /// Lifecycle state.
    pub state: SlotState,
    /// The page's key. Meaningful for `Ready` and `Doomed` slots only.
    pub key: PageKey,
    /// The page's metadata. Meaningful for `Ready` and `Doomed` slots only.
    pub meta: PageMeta,
    /// Pinned pages are never evicted.
    pub pinned: bool,
    /// Reads in flight (between `begin_read` and `end_read`).
    pub readers: u32,
    /// The on-disk header of the slot may still describe a valid page, so it
    /// must be cleared before the slot is reused.
    pub needs_clear: bool,
}

impl SlotInfo {
    const FREE: SlotInfo = SlotInfo {
        state: SlotState::Free,
        key: PageKey {
            file_id: 0,
            page_index: 0,
        },
        meta: PageMeta::ZERO,
        pinned: false,
        readers: 0,
        needs_clear: false,
    };
}

/// A slot reserved for a put (now `Filling`).
#[derive(Debug, PartialEq, Eq)]
pub struct Reservation {
    /// The reserved slot.
    pub slot: SlotId,
    /// The slot's on-disk header may still describe a valid page.
    pub needs_clear: bool,
    /// The page evicted to make room, if any.
    pub evicted: Option<PageKey>,
}

/// Why [`Index::reserve`] failed.
#[derive(Debug, PartialEq, Eq)]
pub enum ReserveError {
    /// Every slot is pinned, filling, doomed or being read.
    Full,
}

impl fmt::Display for ReserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReserveError::Full => f.write_str(
                "no slot available: every slot is pinned, filling, doomed or being read",
            ),
        }
    }
}

impl std::error::Error for ReserveError {}

/// Outcome of removing a key.
#[derive(Debug, PartialEq, Eq)]
pub enum Removal {
    /// The key was not mapped (or not to the given slot).
    NotFound,
    /// The slot is now `Doomed` with no readers: clear its header, then call
    /// [`Index::reclaimed`].
    Reclaim(SlotId),
    /// The slot is now `Doomed` but has readers; the last
    /// [`Index::end_read`] will return `true`.
    Deferred(SlotId),
}

/// Event counters of an [`Index`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// `begin_read` calls that found the key.
    pub hits: u64,
    /// `begin_read` calls that did not find the key.
    pub misses: u64,
    /// Pages evicted by `reserve`.
    pub evictions: u64,
    /// `reserve` calls that failed with [`ReserveError::Full`].
    pub full: u64,
    /// Pages displaced by a `commit` (or `restore`) of the same key.
    pub displaced: u64,
}

/// Position marker for "not in a free stack".
const NOT_FREE: u32 = u32::MAX;

/// The page index of one shard: key -> slot map plus slot lifecycle.
pub struct Index {
    map: BTreeMap<PageKey, SlotId>,
    slots: Vec<SlotInfo>,
    /// Free slots whose header needs no clearing (preferred by `reserve`).
    free_clean: Vec<SlotId>,
    /// Free slots whose header must be cleared before reuse.
    free_dirty: Vec<SlotId>,
    /// For a Free slot, its position in its free stack; else `NOT_FREE`.
    free_pos: Vec<u32>,
    policy: Box<dyn EvictionPolicy>,
    bytes: u64,
    stats: IndexStats,
}

impl Index {
    /// An index of `nslots` Free slots (`needs_clear == false`), handing out
    /// slot 0 first. `policy` must be empty and sized for `nslots`.
    pub fn new(nslots: u32, policy: Box<dyn EvictionPolicy>) -> Self {
        let n = nslots as usize;
        Self {
            map: BTreeMap::new(),
            slots: vec![SlotInfo::FREE; n],
            // A stack: the last element is handed out first.
            free_clean: (0..nslots).rev().collect(),
            free_dirty: Vec::with_capacity(n),
            free_pos: (0..nslots).rev().collect(),
            policy,
            bytes: 0,
            stats: IndexStats::default(),
        }
    }

    /// Number of slots.
    pub fn nslots(&self) -> u32 {
        // `new` took the count as a u32.
        self.slots.len() as u32
    }

    /// Number of Ready pages (mapped keys).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no page is Ready.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Sum of the Ready pages' lengths.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Number of Free slots.
    pub fn free_count(&self) -> usize {
        self.free_clean.len() + self.free_dirty.len()
    }

    /// Event counters.
    pub fn stats(&self) -> IndexStats {
        self.stats
    }

    /// State of `slot`. Panics if `slot >= nslots`.
    pub fn slot(&self, slot: SlotId) -> &SlotInfo {
        &self.slots[slot as usize]
    }

    /// The slot of a Ready page. No side effects.
    pub fn lookup(&self, key: &PageKey) -> Option<SlotId> {
        self.map.get(key).copied()
    }

    /// Whether a Ready page has this key.
    pub fn contains(&self, key: &PageKey) -> bool {
        self.map.contains_key(key)
    }

    /// A hit: counts a reader on the page's slot (until [`Index::end_read`])
    /// and tells the policy (unless pinned). Returns the slot and metadata.
    /// Does not allocate.
    pub fn begin_read(&mut self, key: &PageKey) -> Option<(SlotId, PageMeta)> {
        let Some(&slot) = self.map.get(key) else {
            self.stats.misses += 1;
            return None;
        };
        self.stats.hits += 1;
        let info = &mut self.slots[slot as usize];
        info.readers += 1;
        if !info.pinned {
            self.policy.access(slot);
        }
        Some((slot, info.meta))
    }

    /// A read of `slot` finished. Returns `true` when the slot is Doomed and
    /// now has no readers: the caller must clear the on-disk header and then
    /// call [`Index::reclaimed`].
    pub fn end_read(&mut self, slot: SlotId) -> bool {
        let info = &mut self.slots[slot as usize];
        debug_assert!(info.readers > 0, "end_read on slot {slot} without readers");
        info.readers = info.readers.saturating_sub(1);
        info.state == SlotState::Doomed && info.readers == 0
    }

    /// Reserves a slot for a put; it becomes Filling.
    ///
    /// Takes a Free slot if there is one (preferring slots whose header needs
    /// no clearing), else evicts through the policy, skipping slots with
    /// readers. An evicted page leaves the map at once; `evicted` names it and
    /// `needs_clear` is `true`.
    ///
    /// # Errors
    ///
    /// [`ReserveError::Full`] if no slot is Free and every Ready page is
    /// pinned or being read.
    pub fn reserve(&mut self) -> Result<Reservation, ReserveError> {
        if let Some(slot) = self.pop_free() {
            let info = &mut self.slots[slot as usize];
            info.state = SlotState::Filling;
            info.pinned = false;
            return Ok(Reservation {
                slot,
                needs_clear: info.needs_clear,
                evicted: None,
            });
        }
        let slots = &self.slots;
        let Some(slot) = self.policy.evict(&mut |s| slots[s as usize].readers > 0) else {
            self.stats.full += 1;
            return Err(ReserveError::Full);
        };
        self.stats.evictions += 1;
        let info = &mut self.slots[slot as usize];
        debug_assert!(
            info.state == SlotState::Ready && !info.pinned && info.readers == 0,
            "policy evicted slot {slot} in state {info:?}"
        );
        self.map.remove(&info.key);
        self.bytes -= u64::from(info.meta.len);
        info.state = SlotState::Filling;
        info.pinned = false;
        info.needs_clear = true;
        Ok(Reservation {
            slot,
            needs_clear: true,
            evicted: Some(info.key),
        })
    }

    /// Publishes the Filling `slot` as `key`; it becomes Ready, enters the map
    /// and, unless `pinned`, the policy.
    ///
    /// If `key` was already mapped to another slot, that slot is displaced: it
    /// becomes Doomed and leaves the policy. Returns `Some(old)` if it has no
    /// readers (the caller clears its header, then calls
    /// [`Index::reclaimed`]); otherwise the last [`Index::end_read`] on it
    /// returns `true`.
    ///
    /// # Panics
    ///
    /// If `slot` is not Filling.
    pub fn commit(
        &mut self,
        slot: SlotId,
        key: PageKey,
        meta: PageMeta,
        pinned: bool,
    ) -> Option<SlotId> {
        assert_eq!(
            self.slots[slot as usize].state,
            SlotState::Filling,
            "commit of slot {slot} that is not Filling"
        );
        let displaced = self.map.get(&key).copied().and_then(|old| {
            self.stats.displaced += 1;
            match self.doom(old) {
                Removal::Reclaim(old) => Some(old),
                _ => None,
            }
        });
        self.publish(slot, key, meta, pinned);
        displaced
    }

    /// A put failed: the Filling `slot` becomes Free. `needs_clear` says
    /// whether its on-disk header may still describe a valid page.
    ///
    /// # Panics
    ///
    /// If `slot` is not Filling.
    pub fn abort(&mut self, slot: SlotId, needs_clear: bool) {
        let info = &mut self.slots[slot as usize];
        assert_eq!(
            info.state,
            SlotState::Filling,
            "abort of slot {slot} that is not Filling"
        );
        info.needs_clear = needs_clear;
        self.push_free(slot);
    }

    /// Removes `key`: it leaves the map and the policy at once, so later
    /// lookups miss. The slot becomes Doomed; see [`Removal`].
    pub fn remove(&mut self, key: &PageKey) -> Removal {
        match self.map.remove(key) {
            Some(slot) => self.doom(slot),
            None => Removal::NotFound,
        }
    }

    /// Like [`Index::remove`], but only if `key` is still mapped to `slot`
    /// (used when a read found a corrupt page).
    pub fn remove_if_slot(&mut self, key: &PageKey, slot: SlotId) -> Removal {
        if self.map.get(key) == Some(&slot) {
            self.remove(key)
        } else {
            Removal::NotFound
        }
    }

    /// Removes every page of `file_id`. Returns the slots to reclaim now (see
    /// [`Removal::Reclaim`]) and how many were deferred because of readers.
    pub fn remove_file(&mut self, file_id: u128) -> (Vec<SlotId>, usize) {
        let range = PageKey::new(file_id, 0)..=PageKey::new(file_id, u64::MAX);
        let doomed: Vec<(PageKey, SlotId)> = self.map.range(range).map(|(k, &s)| (*k, s)).collect();
        let mut reclaim = Vec::with_capacity(doomed.len());
        let mut deferred = 0;
        for (key, slot) in doomed {
            self.map.remove(&key);
            match self.doom(slot) {
                Removal::Reclaim(s) => reclaim.push(s),
                _ => deferred += 1,
            }
        }
        (reclaim, deferred)
    }

    /// Keys of the Ready pages of one file, in page order (a B-tree range, not a scan).
    pub fn file_keys(&self, file_id: u128) -> impl Iterator<Item = PageKey> + '_ {
        self.map
            .range(PageKey::new(file_id, 0)..=PageKey::new(file_id, u64::MAX))
            .map(|(k, _)| *k)
    }

    /// The Doomed `slot` becomes Free after the I/O layer cleared its header
    /// (`cleared == true`) or failed to (`false`: `needs_clear` stays true).
    ///
    /// # Panics
    ///
    /// If `slot` is not Doomed.
    pub fn reclaimed(&mut self, slot: SlotId, cleared: bool) {
        let info = &mut self.slots[slot as usize];
        assert_eq!(
            info.state,
            SlotState::Doomed,
            "reclaimed of slot {slot} that is not Doomed"
        );
        debug_assert_eq!(info.readers, 0, "reclaimed slot {slot} has readers");
        info.needs_clear = !cleared;
        self.push_free(slot);
    }

    /// Pins or unpins a Ready `key`. Pinned pages leave the policy (never
    /// evicted); unpinning re-inserts them. Returns the slot, or `None` if the
    /// key is absent.
    pub fn set_pinned(&mut self, key: &PageKey, pinned: bool) -> Option<SlotId> {
        let slot = *self.map.get(key)?;
        let info = &mut self.slots[slot as usize];
        if info.pinned != pinned {
            info.pinned = pinned;
            if pinned {
                self.policy.remove(slot);
            } else {
                self.policy.insert(slot, key.hash64());
            }
        }
        Some(slot)
    }

    /// Start-up: marks the Free `slot` Ready with a page found on disk.
    /// The caller restores in ascending `inserted_ms` order.
    ///
    /// If `key` is already mapped (a duplicate on disk), the copy with the
    /// larger `inserted_ms` wins (on a tie, the one restored last). The losing
    /// slot is returned, left Doomed with no readers: the caller clears its
    /// header and calls [`Index::reclaimed`].
    ///
    /// # Panics
    ///
    /// If `slot` is not Free.
    pub fn restore(
        &mut self,
        slot: SlotId,
        key: PageKey,
        meta: PageMeta,
        pinned: bool,
    ) -> Option<SlotId> {
        let was_free = self.take_free(slot);
        assert!(was_free, "restore of slot {slot} that is not Free");
        let info = &mut self.slots[slot as usize];
        info.state = SlotState::Filling;
        let Some(&old) = self.map.get(&key) else {
            self.publish(slot, key, meta, pinned);
            return None;
        };
        self.stats.displaced += 1;
        if meta.inserted_ms >= self.slots[old as usize].meta.inserted_ms {
            self.map.remove(&key);
            self.doom(old);
            self.publish(slot, key, meta, pinned);
            Some(old)
        } else {
            let info = &mut self.slots[slot as usize];
            info.state = SlotState::Doomed;
            info.key = key;
            info.meta = meta;
            info.pinned = pinned;
            info.needs_clear = true;
            Some(slot)
        }
    }

    /// Keys of Ready pages with their slots, in key order.
    pub fn keys(&self) -> impl Iterator<Item = (&PageKey, SlotId)> {
        self.map.iter().map(|(k, &s)| (k, s))
    }

    /// Name of the eviction policy.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Makes a Filling `slot` Ready as `key` (which must not be mapped).
    fn publish(&mut self, slot: SlotId, key: PageKey, meta: PageMeta, pinned: bool) {
        let info = &mut self.slots[slot as usize];
        info.state = SlotState::Ready;
        info.key = key;
        info.meta = meta;
        info.pinned = pinned;
        info.readers = 0;
        info.needs_clear = true;
        self.bytes += u64::from(meta.len);
        self.map.insert(key, slot);
        if !pinned {
            self.policy.insert(slot, key.hash64());
        }
    }

    /// Makes the Ready `slot` Doomed. The caller has already removed (or
    /// replaced) its map entry.
    fn doom(&mut self, slot: SlotId) -> Removal {
        let info = &mut self.slots[slot as usize];
        debug_assert_eq!(info.state, SlotState::Ready);
        info.state = SlotState::Doomed;
        info.needs_clear = true;
        self.bytes -= u64::from(info.meta.len);
        self.policy.remove(slot);
        if info.readers == 0 {
            Removal::Reclaim(slot)
        } else {
            Removal::Deferred(slot)
        }
    }

    /// Marks `slot` Free and puts it on the free stack that matches its
    /// `needs_clear`.
    fn push_free(&mut self, slot: SlotId) {
        let info = &mut self.slots[slot as usize];
        info.state = SlotState::Free;
        info.pinned = false;
        info.readers = 0;
        let stack = if info.needs_clear {
            &mut self.free_dirty
        } else {
            &mut self.free_clean
        };
        // Stacks hold at most `nslots` (a u32) entries.
        self.free_pos[slot as usize] = stack.len() as u32;
        stack.push(slot);
    }

    /// Takes a Free slot off a free stack, preferring clean ones.
    fn pop_free(&mut self) -> Option<SlotId> {
        let slot = self.free_clean.pop().or_else(|| self.free_dirty.pop())?;
        self.free_pos[slot as usize] = NOT_FREE;
        Some(slot)
    }

    /// Takes a specific slot off its free stack; `false` if it is not Free.
    fn take_free(&mut self, slot: SlotId) -> bool {
        let pos = match self.free_pos.get(slot as usize) {
            Some(&pos) if pos != NOT_FREE => pos as usize,
            _ => return false,
        };
        let stack = if self.slots[slot as usize].needs_clear {
            &mut self.free_dirty
        } else {
            &mut self.free_clean
        };
        stack.swap_remove(pos);
        if let Some(&moved) = stack.get(pos) {
            self.free_pos[moved as usize] = pos as u32;
        }
        self.free_pos[slot as usize] = NOT_FREE;
        true
    }

    /// Panics if any internal invariant is broken.
    #[cfg(test)]
    fn check_invariants(&self) {
        use std::collections::BTreeSet;

        for (key, &slot) in &self.map {
            let info = &self.slots[slot as usize];
            assert_eq!(info.state, SlotState::Ready, "mapped slot {slot} not Ready");
            assert_eq!(info.key, *key, "mapped slot {slot} has another key");
        }
        let mut free_seen = BTreeSet::new();
        for (dirty, stack) in [(false, &self.free_clean), (true, &self.free_dirty)] {
            for (pos, &slot) in stack.iter().enumerate() {
                assert!(free_seen.insert(slot), "slot {slot} twice in free lists");
                let info = &self.slots[slot as usize];
                assert_eq!(info.state, SlotState::Free, "listed slot {slot} not Free");
                assert_eq!(info.needs_clear, dirty, "slot {slot} in wrong free list");
                assert_eq!(self.free_pos[slot as usize] as usize, pos);
            }
        }
        let mut ready = 0;
        let mut tracked = 0;
        let mut bytes = 0;
        for (i, info) in self.slots.iter().enumerate() {
            let slot = i as SlotId;
            let in_policy = self.policy.contains(slot);
            match info.state {
                SlotState::Free => {
                    assert!(free_seen.contains(&slot), "Free slot {slot} not listed");
                }
                SlotState::Ready => {
                    ready += 1;
                    bytes += u64::from(info.meta.len);
                    assert_eq!(
                        self.map.get(&info.key),
                        Some(&slot),
                        "Ready slot {slot} unmapped"
                    );
                    assert!(info.needs_clear, "Ready slot {slot} without needs_clear");
                    assert_eq!(in_policy, !info.pinned, "policy membership of {slot}");
                    tracked += usize::from(!info.pinned);
                }
                SlotState::Filling | SlotState::Doomed => {
                    assert!(!in_policy, "{:?} slot {slot} in policy", info.state);
                }
            }
            if matches!(info.state, SlotState::Free | SlotState::Filling) {
                assert_eq!(info.readers, 0, "readers on {:?} slot {slot}", info.state);
            }
            if info.state != SlotState::Free {
                assert_eq!(self.free_pos[i], NOT_FREE);
            }
        }
        assert_eq!(ready, self.map.len());
        assert_eq!(self.policy.len(), tracked);
        assert_eq!(self.bytes, bytes);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
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
        assert_eq!(idx.begin_read(&PageKey::new(1, 3)), None);
        assert_eq!(idx.begin_read(&k), Some((0, meta(10, 0))));
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
        idx.begin_read(&a).unwrap();
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
            let (slot, m) = idx.begin_read(&k).unwrap();
            assert_eq!((slot, m.len), (old, 100));
            idx.begin_read(&k).unwrap();
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
        assert_eq!(idx.restore(4, k, meta(10, 100), false), None);
        assert_eq!(idx.restore(2, other, meta(20, 100), true), None);
        idx.check_invariants();
        // A newer copy wins; the older slot is returned Doomed.
        assert_eq!(idx.restore(1, k, meta(30, 200), false), Some(4));
        assert_eq!(idx.slot(4).state, SlotState::Doomed);
        assert_eq!(idx.slot(4).readers, 0);
        assert_eq!(idx.lookup(&k), Some(1));
        assert_eq!(idx.bytes(), 50);
        idx.check_invariants();
        // An older copy (out of order) loses itself.
        assert_eq!(idx.restore(5, k, meta(40, 150), false), Some(5));
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
        idx.begin_read(&PageKey::new(2, 1)).unwrap();
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
        idx.begin_read(&k).unwrap();
        assert_eq!(idx.remove(&k), Removal::Deferred(slots[&k]));
        assert_eq!(idx.begin_read(&k), None);
        assert!(idx.end_read(slots[&k]));
        idx.reclaimed(slots[&k], false);
        idx.check_invariants();
        assert_eq!(idx.set_pinned(&k, true), None);
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
        /// reserve, then commit (outcome >= 2) or abort (dirty if outcome == 0).
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
        Pin(u64),
        Unpin(u64),
        /// Pin the n-th present key (modulo), if any.
        PinNth(usize),
        /// Start a read of the n-th present key (modulo), if any.
        StartReadNth(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..NKEYS, 0u8..8).prop_map(|(key, outcome)| Op::Put { key, outcome }),
            4 => (0..NKEYS).prop_map(Op::StartRead),
            3 => any::<usize>().prop_map(Op::FinishRead),
            1 => any::<usize>().prop_map(Op::CorruptRead),
            1 => (0..NKEYS).prop_map(Op::Remove),
            1 => (0..NFILES).prop_map(Op::RemoveFile),
            1 => (0..NKEYS).prop_map(Op::Pin),
            2 => any::<usize>().prop_map(Op::PinNth),
            2 => any::<usize>().prop_map(Op::StartReadNth),
            1 => (0..NKEYS).prop_map(Op::Unpin),
        ]
    }

    #[derive(Clone, Copy, Debug)]
    struct Entry {
        slot: SlotId,
        pinned: bool,
        meta: PageMeta,
    }

    /// The index under test plus a simple model of what it should hold.
    struct Harness {
        idx: Index,
        lru: bool,
        present: BTreeMap<u64, Entry>,
        /// Reads in flight: (key, slot).
        readers: Vec<(u64, SlotId)>,
        /// Unpinned present keys, most recently used first.
        recency: VecDeque<u64>,
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
            self.recency.retain(|&x| x != k);
            self.present.remove(&k)
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
                ref other => other.clone(),
            };
            match op {
                Op::Put { key: k, outcome } => self.put(k, outcome, cleared),
                Op::StartRead(k) => {
                    let got = self.idx.begin_read(&key(k));
                    match self.present.get(&k).copied() {
                        Some(e) => {
                            assert_eq!(got, Some((e.slot, e.meta)));
                            self.readers.push((k, e.slot));
                            if !e.pinned {
                                self.recency.retain(|&x| x != k);
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
                Op::PinNth(_) | Op::StartReadNth(_) => unreachable!(),
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
                        self.recency.retain(|&x| x != k);
                        if !pin {
                            self.recency.push_front(k);
                        }
                    }
                }
            }
        }

        fn put(&mut self, k: u64, outcome: u8, cleared: bool) {
            let free = NSLOTS as usize - self.present.len() - self.doomed().len();
            let clean_free = (0..NSLOTS).any(|s| {
                self.idx.slot(s).state == SlotState::Free && !self.idx.slot(s).needs_clear
            });
            let evictable = self
                .present
                .values()
                .any(|e| !e.pinned && !self.busy(e.slot));
            let lru_victim = self
                .recency
                .iter()
                .rev()
                .copied()
                .find(|k| !self.busy(self.present[k].slot));
            let r = match self.idx.reserve() {
                Err(ReserveError::Full) => {
                    assert!(free == 0 && !evictable, "Full with free={free}");
                    return;
                }
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
                    let m = PageMeta {
                        len: (k as u32) * 100 + u32::from(outcome),
                        version: self.step,
                        inserted_ms: self.step,
                    };
                    let got = self.idx.commit(r.slot, key(k), m, pinned);
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
                            meta: m,
                        },
                    );
                    if !pinned {
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
                assert_eq!(info.meta, e.meta);
            }
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
}
