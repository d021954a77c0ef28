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

use std::fmt;
use std::str::FromStr;

mod lists;
mod lru;
mod s3fifo;

pub use lists::SlotLists;
pub use lru::Lru;
#[cfg(test)]
use s3fifo::Ghost;
pub use s3fifo::S3Fifo;

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
    /// The page in `slot` is unlikely to be read again (a version that a newer one replaced):
    /// it goes before every page not demoted, demoted pages in the order of their demotion.
    /// A read of it after its demotion gives it a place as a page read once (a reader that
    /// opened the old version reads on). O(1); a no-op for an untracked slot.
    fn demote(&mut self, slot: SlotId);
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

#[cfg(test)]
mod tests;
