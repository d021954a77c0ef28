//! The memory tier: a shard's hottest pages also kept in RAM, in front of its disk cache, so a
//! read of one is answered without a disk read and sent from the same `Bytes` every time (no
//! copy per read: [`crate::endpoint::Body::Shared`]).
//!
//! Admission is S3-FIFO's (Yang et al., SOSP'23; the engine's eviction policy in
//! `engine/src/policy/s3fifo.rs` works the same way over disk slots), adapted to a tier whose
//! entries cost a copy when they come from disk:
//!
//! - a page just loaded from the under storage enters the small FIFO (about 10% of the bytes):
//!   its bytes are already in memory, so keeping them costs no copy;
//! - a page read from disk that is not in memory is only remembered in the ghost FIFO (a key
//!   hash, no bytes) the first time; read again while the ghost still remembers it, it is copied
//!   once into the main FIFO. A one-pass scan of the disk cache therefore copies nothing;
//! - a page leaving the small FIFO moves to the main FIFO if it was read while there, else only
//!   its hash goes to the ghost; the main FIFO gives a page that was read since its last turn
//!   another turn (its counter, at most 3, goes down by one) and evicts the others.
//!
//! Keys name the page's version (`hash64` of the object's version tag), so an entry is exactly
//! the bytes of the version a request names; a write to a page or the removal of a file drops
//! every version of it. Everything lives on the shard's thread (no locks); a hit is a `BTreeMap`
//! lookup and a reference count, with no allocation.

use std::collections::{BTreeMap, HashMap, VecDeque};

use bytes::Bytes;

/// Saturation value of an entry's read counter.
const MAX_FREQ: u8 = 3;

/// A page at a version: what a memory entry holds the bytes of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemKey {
    /// The file id (path and version tag).
    pub file_id: u128,
    /// Page index within the file.
    pub page: u64,
    /// `hash64(version_tag)`, as the engine stores pages.
    pub version: u64,
}

impl MemKey {
    fn hash(&self) -> u64 {
        // A page's id mixed with its version (splitmix64 finalizer).
        let mut x = (self.file_id as u64)
            ^ ((self.file_id >> 64) as u64).rotate_left(17)
            ^ self.page.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ self.version.rotate_left(41);
        x ^= x >> 30;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^= x >> 27;
        x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Queue {
    Small,
    Main,
}

struct Entry {
    bytes: Bytes,
    freq: u8,
    queue: Queue,
    /// Which push of this key into a queue is current (older queue positions are stale).
    seq: u64,
}

/// The memory tier's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Reads answered from memory.
    pub hits: u64,
    /// Pages that entered the tier.
    pub admissions: u64,
    /// Pages that left it to make room.
    pub evictions: u64,
    /// Bytes held now.
    pub bytes: u64,
    /// Pages held now.
    pub pages: u64,
    /// The tier's capacity in bytes.
    pub capacity: u64,
}

/// Key hashes of pages seen recently but not held: a bounded FIFO with a count per hash.
struct Ghost {
    order: VecDeque<u64>,
    count: HashMap<u64, u32>,
    limit: usize,
}

impl Ghost {
    fn new(limit: usize) -> Ghost {
        Ghost {
            order: VecDeque::with_capacity(limit),
            count: HashMap::with_capacity(limit),
            limit,
        }
    }

    fn contains(&self, h: u64) -> bool {
        self.count.contains_key(&h)
    }

    fn insert(&mut self, h: u64) {
        if self.order.len() == self.limit {
            if let Some(old) = self.order.pop_front() {
                self.forget(old);
            }
        }
        self.order.push_back(h);
        *self.count.entry(h).or_insert(0) += 1;
    }

    fn forget(&mut self, h: u64) {
        if let Some(c) = self.count.get_mut(&h) {
            *c -= 1;
            if *c == 0 {
                self.count.remove(&h);
            }
        }
    }

    /// Whether `h` was remembered; it is not any more.
    fn take(&mut self, h: u64) -> bool {
        // The FIFO keeps its position until it falls out; only the count says it is gone.
        self.count.remove(&h).is_some()
    }
}

/// One shard's memory tier (see the module docs). Not `Send`: it lives on its shard's thread.
pub struct MemoryTier {
    capacity: u64,
    small_target: u64,
    entries: BTreeMap<MemKey, Entry>,
    small: VecDeque<(MemKey, u64)>,
    main: VecDeque<(MemKey, u64)>,
    small_bytes: u64,
    main_bytes: u64,
    ghost: Ghost,
    next_seq: u64,
    stats: MemoryStats,
}

impl MemoryTier {
    /// A tier of `capacity` bytes for pages of up to `page_size` bytes. The ghost remembers as
    /// many pages as the main FIFO holds (at least 16).
    pub fn new(capacity: u64, page_size: u32) -> MemoryTier {
        let pages = (capacity / u64::from(page_size.max(1))) as usize;
        MemoryTier {
            capacity,
            small_target: capacity / 10,
            entries: BTreeMap::new(),
            small: VecDeque::with_capacity(pages / 4 + 1),
            main: VecDeque::with_capacity(pages + 1),
            small_bytes: 0,
            main_bytes: 0,
            ghost: Ghost::new(pages.max(16)),
            next_seq: 0,
            stats: MemoryStats {
                capacity,
                ..MemoryStats::default()
            },
        }
    }

    /// The counters, with what the tier holds now.
    pub fn stats(&self) -> MemoryStats {
        MemoryStats {
            bytes: self.small_bytes + self.main_bytes,
            pages: self.entries.len() as u64,
            ..self.stats
        }
    }

    /// The bytes of `key`, if held (a read: the entry's counter goes up).
    pub fn get(&mut self, key: &MemKey) -> Option<Bytes> {
        let e = self.entries.get_mut(key)?;
        e.freq = (e.freq + 1).min(MAX_FREQ);
        self.stats.hits += 1;
        Some(e.bytes.clone())
    }

    /// Whether `key` is held (no read counted).
    pub fn contains(&self, key: &MemKey) -> bool {
        self.entries.contains_key(key)
    }

    /// A page just loaded from the under storage: it enters the small FIFO (the main one if the
    /// ghost remembers it), or, if held already, counts as a read.
    pub fn offer_loaded(&mut self, key: MemKey, bytes: Bytes) {
        if let Some(e) = self.entries.get_mut(&key) {
            e.freq = (e.freq + 1).min(MAX_FREQ);
            return;
        }
        let queue = if self.ghost.take(key.hash()) {
            Queue::Main
        } else {
            Queue::Small
        };
        self.admit(key, bytes, queue);
    }

    /// A page read from disk that is not held: `true` if it should be copied in now (the ghost
    /// remembers it: it was read recently), in which case the caller passes its whole bytes to
    /// [`MemoryTier::admit_copy`]; otherwise the ghost remembers it from now on.
    pub fn wants_from_disk(&mut self, key: &MemKey) -> bool {
        if self.entries.contains_key(key) || !self.fits(0) {
            return false;
        }
        let h = key.hash();
        if self.ghost.contains(h) {
            return true;
        }
        self.ghost.insert(h);
        false
    }

    /// A page read from disk a second time (see [`MemoryTier::wants_from_disk`]): it enters the
    /// main FIFO.
    pub fn admit_copy(&mut self, key: MemKey, bytes: Bytes) {
        if self.entries.contains_key(&key) {
            return;
        }
        self.ghost.take(key.hash());
        self.admit(key, bytes, Queue::Main);
    }

    /// Whether a page of `len` more bytes can be held at all.
    fn fits(&self, len: u64) -> bool {
        self.capacity > 0 && len <= self.capacity
    }

    fn admit(&mut self, key: MemKey, bytes: Bytes, queue: Queue) {
        let len = bytes.len() as u64;
        if !self.fits(len) {
            return;
        }
        self.next_seq += 1;
        let seq = self.next_seq;
        match queue {
            Queue::Small => {
                self.small.push_back((key, seq));
                self.small_bytes += len;
            }
            Queue::Main => {
                self.main.push_back((key, seq));
                self.main_bytes += len;
            }
        }
        self.entries.insert(
            key,
            Entry {
                bytes,
                freq: 0,
                queue,
                seq,
            },
        );
        self.stats.admissions += 1;
        self.make_room();
    }

    /// Evicts until the tier is within its capacity.
    fn make_room(&mut self) {
        while self.small_bytes + self.main_bytes > self.capacity {
            let from_small = self.small_bytes > self.small_target || self.main_bytes == 0;
            let progressed = if from_small {
                self.evict_small()
            } else {
                self.evict_main()
            };
            if !progressed {
                // Only stale positions were left in the queue chosen; the other holds the bytes.
                if !(self.evict_main() || self.evict_small()) {
                    break;
                }
            }
        }
        self.compact();
    }

    /// The current entry a queue position names, if it still does.
    fn current(&self, key: &MemKey, seq: u64, queue: Queue) -> bool {
        self.entries
            .get(key)
            .is_some_and(|e| e.seq == seq && e.queue == queue)
    }

    /// Takes the oldest page of the small FIFO out: to the main FIFO if it was read there, else
    /// out of memory (its hash to the ghost). `false` if the queue held no current entry.
    fn evict_small(&mut self) -> bool {
        while let Some((key, seq)) = self.small.pop_front() {
            if !self.current(&key, seq, Queue::Small) {
                continue;
            }
            self.next_seq += 1;
            let next = self.next_seq;
            let Some(e) = self.entries.get_mut(&key) else {
                continue;
            };
            let len = e.bytes.len() as u64;
            self.small_bytes -= len;
            if e.freq > 0 {
                e.freq = 0;
                e.queue = Queue::Main;
                e.seq = next;
                self.main.push_back((key, next));
                self.main_bytes += len;
            } else {
                self.entries.remove(&key);
                self.ghost.insert(key.hash());
                self.stats.evictions += 1;
            }
            return true;
        }
        false
    }

    /// Takes the oldest page of the main FIFO out, giving pages read since their last turn
    /// another one. `false` if the queue held no current entry.
    fn evict_main(&mut self) -> bool {
        while let Some((key, seq)) = self.main.pop_front() {
            if !self.current(&key, seq, Queue::Main) {
                continue;
            }
            self.next_seq += 1;
            let next = self.next_seq;
            let Some(e) = self.entries.get_mut(&key) else {
                continue;
            };
            if e.freq > 0 {
                e.freq -= 1;
                e.seq = next;
                self.main.push_back((key, next));
                continue;
            }
            self.main_bytes -= e.bytes.len() as u64;
            self.entries.remove(&key);
            self.stats.evictions += 1;
            return true;
        }
        false
    }

    /// Drops stale queue positions once they outnumber the entries (after many removals).
    fn compact(&mut self) {
        let live = self.entries.len();
        if self.small.len() + self.main.len() <= 2 * live + 64 {
            return;
        }
        let entries = &self.entries;
        let keep = |q: Queue| {
            move |(k, s): &(MemKey, u64)| {
                entries.get(k).is_some_and(|e| e.seq == *s && e.queue == q)
            }
        };
        self.small.retain(keep(Queue::Small));
        self.main.retain(keep(Queue::Main));
    }

    fn remove_range(&mut self, from: MemKey, to: MemKey) -> usize {
        let keys: Vec<MemKey> = self.entries.range(from..=to).map(|(k, _)| *k).collect();
        for k in &keys {
            if let Some(e) = self.entries.remove(k) {
                let len = e.bytes.len() as u64;
                match e.queue {
                    Queue::Small => self.small_bytes -= len,
                    Queue::Main => self.main_bytes -= len,
                }
            }
        }
        self.compact();
        keys.len()
    }

    /// Drops every version of page `page` of file `file_id` (a write to the page). Returns how
    /// many entries went.
    pub fn remove_page(&mut self, file_id: u128, page: u64) -> usize {
        let k = |version| MemKey {
            file_id,
            page,
            version,
        };
        self.remove_range(k(0), k(u64::MAX))
    }

    /// Drops every page of file `file_id` (`RemoveFile`, `Invalidate`). Returns how many
    /// entries went.
    pub fn remove_file(&mut self, file_id: u128) -> usize {
        let k = |page, version| MemKey {
            file_id,
            page,
            version,
        };
        self.remove_range(k(0, 0), k(u64::MAX, u64::MAX))
    }
}

#[cfg(test)]
mod tests;
