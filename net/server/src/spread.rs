//! Hot-page replicas, the bookkeeping half (no I/O, no clock of its own: callers pass `now`).
//!
//! A page that many readers want at once is served by one shard, its owner: that shard's core,
//! and its node's network, are the limit however many nodes the cluster has. So the owner
//! measures each page's read rate, and a page read faster than a threshold becomes *hot*: the
//! owner's answers say over how many members (the owner and the next ring members on distinct
//! nodes) readers may spread it, and clients then send their reads of that page to any of them.
//! A member that is asked for a hot page it does not hold copies it from the owner, peer to peer,
//! never from the under storage (the loader's single flight makes that one copy per member), and
//! keeps it as an ordinary cached page, checksummed like any other. Once nobody reads a copy for
//! a while it is dropped again.
//!
//! Two tables, one per side, each on its shard's thread:
//!
//! - [`HotPages`] (the owner): a direct-mapped table of decayed read counts. A read adds 1 to its
//!   page's count after decaying it by `2^(-elapsed / half_life)`; at a steady `r` reads per
//!   second a count settles at `r * half_life / ln 2`. A page turns hot when its rate reaches
//!   `threshold` reads per second, and cools only when it falls below `threshold / (2 * spread)`:
//!   once readers spread, the owner sees about `1 / spread` of the reads, and the page must not
//!   flap. A slot holds one page; a colder page that maps to the slot of a page still counting
//!   is not tracked until that one decays (hot pages are few, the table has thousands of slots).
//!   A read costs a hash, one slot and one `exp2`, and never allocates.
//! - [`Replicas`] (a copy's holder): the copies this shard made, with their last read; a sweep
//!   returns those nobody read for `cool`, which the shard then drops. Bounded: past
//!   `max_pages` copies no more are made (reads then go to the owner or are served as misses).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Slots of the owner's rate table, per shard (a power of two).
pub const RATE_SLOTS: usize = 4096;

/// Settings of hot-page replicas, the same on every node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpreadConfig {
    /// Members a hot page is served by, counting its owner (1: replicas off). Clamped to the
    /// cluster's nodes by the ring, which places the members on distinct nodes.
    pub spread: u8,
    /// Reads per second of one page that make it hot.
    pub threshold: f64,
    /// Half-life of a page's read count: how fast the rate forgets.
    pub half_life: Duration,
    /// A copy unread for this long is dropped.
    pub cool: Duration,
    /// Copies one shard keeps at most.
    pub max_pages: usize,
}

impl Default for SpreadConfig {
    fn default() -> Self {
        SpreadConfig {
            spread: 3,
            threshold: 20.0,
            half_life: Duration::from_secs(1),
            cool: Duration::from_secs(30),
            max_pages: 1024,
        }
    }
}

impl SpreadConfig {
    /// Replicas are on (a hot page may be served by more than its owner).
    pub fn enabled(&self) -> bool {
        self.spread > 1 && self.threshold > 0.0
    }
}

#[derive(Clone, Copy)]
struct Rate {
    file_id: u128,
    page: u64,
    count: f64,
    at: Instant,
    hot: bool,
}

/// The owner's read rates per page (see the module docs).
pub struct HotPages {
    config: SpreadConfig,
    slots: Vec<Option<Rate>>,
    /// Count at which a page turns hot, and below which a hot page cools.
    on: f64,
    off: f64,
    /// Pages that turned hot since start.
    turned_hot: u64,
}

/// Slot of a page (splitmix64 of its id).
fn slot_of(file_id: u128, page: u64) -> usize {
    let mut x = (file_id as u64)
        ^ ((file_id >> 64) as u64).rotate_left(23)
        ^ page.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x as usize) & (RATE_SLOTS - 1)
}

impl HotPages {
    /// An empty table for `config`.
    pub fn new(config: SpreadConfig) -> HotPages {
        // Steady state of the decayed count at `r` reads/s: r * half_life / ln 2.
        let per_rate = config.half_life.as_secs_f64() / std::f64::consts::LN_2;
        let on = (config.threshold * per_rate).max(1.0);
        let off = on / (2.0 * f64::from(config.spread.max(1)));
        HotPages {
            config,
            slots: vec![None; RATE_SLOTS],
            on,
            off,
            turned_hot: 0,
        }
    }

    /// The settings.
    pub fn config(&self) -> &SpreadConfig {
        &self.config
    }

    /// One read of page `page` of `file_id` by the owner at `now`. Returns the members readers
    /// may spread the page over: `config.spread` while it is hot, else 0.
    pub fn record(&mut self, file_id: u128, page: u64, now: Instant) -> u8 {
        if !self.config.enabled() {
            return 0;
        }
        let half = self.half_life();
        let i = slot_of(file_id, page);
        match &self.slots[i] {
            Some(r) if r.file_id == file_id && r.page == page => {}
            // Another page still counts in this slot: this one is not tracked for now.
            Some(r) if decayed(r, now, half) >= 1.0 => return 0,
            _ => {
                self.slots[i] = Some(Rate {
                    file_id,
                    page,
                    count: 0.0,
                    at: now,
                    hot: false,
                })
            }
        }
        let Some(rate) = self.slots[i].as_mut() else {
            return 0;
        };
        rate.count = decayed(rate, now, half) + 1.0;
        rate.at = now;
        if !rate.hot && rate.count >= self.on {
            rate.hot = true;
            self.turned_hot += 1;
        } else if rate.hot && rate.count < self.off {
            rate.hot = false;
        }
        if rate.hot {
            self.config.spread
        } else {
            0
        }
    }

    fn half_life(&self) -> f64 {
        self.config.half_life.as_secs_f64().max(1e-3)
    }

    /// Pages hot at `now` (their decayed count still above the cooling point), and pages that
    /// turned hot since start. Scans the table: for reports, not for the read path.
    pub fn counts(&self, now: Instant) -> (u32, u64) {
        let half = self.half_life();
        let hot = self
            .slots
            .iter()
            .flatten()
            .filter(|r| r.hot && decayed(r, now, half) >= self.off)
            .count();
        (hot as u32, self.turned_hot)
    }

    /// Whether page `page` of `file_id` was hot at its last read.
    pub fn is_hot(&self, file_id: u128, page: u64) -> bool {
        matches!(&self.slots[slot_of(file_id, page)], Some(r) if r.file_id == file_id && r.page == page && r.hot)
    }

    /// The spread of page `page` of `file_id` at `now` (0: not hot), without counting a read.
    pub fn spread_of(&self, file_id: u128, page: u64, now: Instant) -> u8 {
        match &self.slots[slot_of(file_id, page)] {
            Some(r)
                if r.file_id == file_id
                    && r.page == page
                    && r.hot
                    && decayed(r, now, self.half_life()) >= self.off =>
            {
                self.config.spread
            }
            _ => 0,
        }
    }
}

/// A rate's count decayed to `now`.
fn decayed(r: &Rate, now: Instant, half_life_s: f64) -> f64 {
    let dt = now.saturating_duration_since(r.at).as_secs_f64();
    r.count * (-dt / half_life_s).exp2()
}

/// A page copy kept as a hot replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CopyKey {
    /// The file id (path and version).
    pub file_id: u128,
    /// Page index.
    pub page: u64,
}

/// The hot-page copies a shard holds for other owners (see the module docs).
pub struct Replicas {
    config: SpreadConfig,
    last_read: HashMap<CopyKey, Instant>,
    copied: u64,
    dropped: u64,
    reads: u64,
}

impl Replicas {
    /// No copies yet.
    pub fn new(config: SpreadConfig) -> Replicas {
        Replicas {
            config,
            last_read: HashMap::new(),
            copied: 0,
            dropped: 0,
            reads: 0,
        }
    }

    /// Whether one more copy may be made now.
    pub fn has_room(&self) -> bool {
        self.last_read.len() < self.config.max_pages
    }

    /// A copy of `key` was made (or found cached) and served at `now`. Returns whether it is
    /// tracked (false: the table is full, the page is served but not kept as a replica).
    pub fn copied(&mut self, key: CopyKey, now: Instant) -> bool {
        if let Some(at) = self.last_read.get_mut(&key) {
            *at = now;
            return true;
        }
        if !self.has_room() {
            return false;
        }
        self.last_read.insert(key, now);
        self.copied += 1;
        true
    }

    /// A read of `key` served from this shard at `now`, as a replica of a hot page.
    pub fn read(&mut self, key: CopyKey, now: Instant) {
        self.reads += 1;
        if let Some(at) = self.last_read.get_mut(&key) {
            *at = now;
        }
    }

    /// Whether `key` is one of the copies.
    pub fn holds(&self, key: &CopyKey) -> bool {
        self.last_read.contains_key(key)
    }

    /// Forgets every copy of file `file_id` (its pages were dropped for another reason).
    pub fn forget_file(&mut self, file_id: u128) {
        self.last_read.retain(|k, _| k.file_id != file_id);
    }

    /// Takes out the copies nobody read for `cool` before `now`: the caller drops their pages.
    pub fn cooled(&mut self, now: Instant) -> Vec<CopyKey> {
        let cool = self.config.cool;
        let mut out: Vec<CopyKey> = self
            .last_read
            .iter()
            .filter(|(_, at)| now.saturating_duration_since(**at) >= cool)
            .map(|(k, _)| *k)
            .collect();
        out.sort_unstable();
        for k in &out {
            self.last_read.remove(k);
        }
        self.dropped += out.len() as u64;
        out
    }

    /// Copies held now, made since start, dropped since start, and reads served as a replica.
    pub fn counts(&self) -> ReplicaCounts {
        ReplicaCounts {
            held: self.last_read.len() as u32,
            copied: self.copied,
            dropped: self.dropped,
            reads: self.reads,
        }
    }
}

/// What [`Replicas::counts`] reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaCounts {
    /// Copies held now.
    pub held: u32,
    /// Copies made since start.
    pub copied: u64,
    /// Copies dropped (cooled) since start.
    pub dropped: u64,
    /// Reads served as a hot replica since start.
    pub reads: u64,
}

#[cfg(test)]
mod tests;
