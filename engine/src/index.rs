//! Per-shard page index: which page lives in which slot, and the lifecycle of
//! every slot. Pure state machine, no I/O and no clock (callers pass `now_ms`).
//!
//! A shard's cache file has `nslots` fixed page slots. The I/O layer calls
//! into [`Index`] and does the disk writes between calls. Slot lifecycle:
//!
//! ```text
//!   Free --reserve--> Filling --commit--> Ready --remove/displace/expire--> Doomed
//!    ^                   |                  |                                 |
//!    |                   +------abort-------|---------------------------------+
//!    |                                      |                                 |
//!    +----------------(evicted by reserve: Ready -> Filling)                  |
//!    +-------------------------------reclaimed--------------------------------+
//! ```
//!
//! * `Free`: unused. `needs_clear` says whether its on-disk header may still
//!   describe a valid page (then the I/O layer must clear it before reuse).
//! * `Filling`: reserved for a put; the data is being written.
//! * `Ready`: published in the map and readable.
//! * `Doomed`: gone from the map; waits for in-flight readers to finish and
//!   for the I/O layer to clear the on-disk header, then `reclaimed` frees it.
//!
//! # Rules
//!
//! Every page carries a rule number (`0`: no rule; see [`crate::rules`]), and
//! the index keeps per-rule accounting ([`RuleStats`]) and enforces the rule's
//! [`RuleLimits`]:
//!
//! * **Quota**: a rule holds at most `quota_pages` pages (Ready plus Filling).
//!   [`Index::reserve_for`] a rule at its quota evicts that rule's oldest page
//!   (insertion order, one intrusive list per rule, no scan of other pages),
//!   pinned by the rule or not; pages pinned by request are never taken.
//! * **TTL**: [`Index::begin_read`] of a page at least `ttl_ms` old (by the
//!   caller's `now_ms`) is a miss that removes the page ([`Lookup::Expired`]).
//! * **Pin**: a rule's pages are published pinned (left out of the policy)
//!   while fewer than the pin cap ([`crate::rules::PIN_CAP_PERCENT`] of the
//!   slots) are pinned; past it they are published unpinned and counted in
//!   [`RuleStats::pins_refused`].
//!
//! Two kinds of pin: `pinned` (by request, [`Index::set_pinned`]; the shard
//! stores it in the header) and `rule_pinned` (by the page's rule; derived
//! again at every start). A page is *held* if either is set, or if it is
//! *dirty*: held pages are never chosen by the eviction policy.
//!
//! # Dirty pages
//!
//! A dirty page ([`Index::commit_with`], [`Index::set_dirty`]; the shard
//! stores the flag in the header) belongs to a file written through the
//! cluster that the under storage does not hold yet: it is the only copy
//! besides its replicas, so neither the policy nor a quota ever evicts it.
//! Only a removal takes it out. Dirty pages are counted apart from pins (they
//! do not count against the pin cap) and by file ([`Index::dirty_files`]).

use std::collections::BTreeMap;
use std::fmt;

use crate::key::PageKey;
use crate::policy::{EvictionPolicy, SlotId, SlotLists};
use crate::rules::{RuleLimits, NO_RULE, PIN_CAP_PERCENT};

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
    /// Pinned by request ([`Index::set_pinned`]): never evicted.
    pub pinned: bool,
    /// Pinned by the page's rule: never evicted by the policy (a rule at its
    /// quota may replace it).
    pub rule_pinned: bool,
    /// Dirty: not in the under storage yet; never evicted (see the module
    /// docs). Meaningful for `Ready` slots.
    pub dirty: bool,
    /// The page's rule number (0: none). Meaningful for `Filling`, `Ready`
    /// and `Doomed` slots.
    pub rule: u8,
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
        rule_pinned: false,
        dirty: false,
        rule: NO_RULE,
        readers: 0,
        needs_clear: false,
    };

    /// Pinned by request or by its rule, or dirty: the policy never evicts it.
    pub fn held(&self) -> bool {
        self.pinned || self.rule_pinned || self.dirty
    }

    /// Pinned by request or by its rule (what the pin cap counts).
    pub fn pinned_any(&self) -> bool {
        self.pinned || self.rule_pinned
    }

    /// In its rule's quota list: a Ready page of a quota rule that neither a
    /// pin by request nor dirtiness keeps out of the quota's reach.
    fn quota_listed(&self, quota: bool) -> bool {
        quota && !self.pinned && !self.dirty
    }
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
    /// The rule is at its quota and none of its pages can be evicted (pinned
    /// by request, being written or being read).
    Quota {
        /// The rule number.
        rule: u8,
    },
}

impl fmt::Display for ReserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReserveError::Full => f.write_str(
                "no slot available: every slot is pinned, filling, doomed or being read",
            ),
            ReserveError::Quota { rule } => write!(
                f,
                "rule {rule} is at its quota and none of its pages can be evicted"
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

/// Outcome of [`Index::begin_read`].
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// A hit: the slot (one more reader until [`Index::end_read`]) and the
    /// page's metadata.
    Hit(SlotId, PageMeta),
    /// The key is not mapped.
    Miss,
    /// The page was past its rule's TTL: a miss, and the page is removed (see
    /// [`Removal`]; the caller clears the header as for a removal).
    Expired(Removal),
}

/// Event counters of an [`Index`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// `begin_read` calls that found the key.
    pub hits: u64,
    /// `begin_read` calls that did not find the key (or found it expired).
    pub misses: u64,
    /// Pages evicted by `reserve` (by the policy or for a quota).
    pub evictions: u64,
    /// `reserve` calls that failed with [`ReserveError::Full`].
    pub full: u64,
    /// Pages displaced by a `commit` (or `restore`) of the same key.
    pub displaced: u64,
}

/// Accounting of one rule in one index: gauges (pages, bytes, pinned) and
/// event counters since the index was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleStats {
    /// Ready pages of the rule.
    pub pages: u64,
    /// Bytes of those pages (their lengths).
    pub bytes: u64,
    /// Ready pages of the rule that are held (pinned by request or by rule).
    pub pinned_pages: u64,
    /// Bytes of those pages.
    pub pinned_bytes: u64,
    /// Pages of the rule committed (restores not counted).
    pub inserts: u64,
    /// Pages of the rule evicted by the policy to make room for any page.
    pub evictions: u64,
    /// Pages of the rule evicted to keep the rule within its quota.
    pub quota_evictions: u64,
    /// Reservations refused: at quota with nothing of the rule evictable.
    pub quota_refusals: u64,
    /// Pages found past the rule's TTL on lookup (dropped, not served).
    pub expirations: u64,
    /// Pages of a pin rule published unpinned because the pin cap was reached.
    pub pins_refused: u64,
}

impl RuleStats {
    /// Adds `o` field by field (summing shards).
    pub fn add(&mut self, o: &RuleStats) {
        self.pages += o.pages;
        self.bytes += o.bytes;
        self.pinned_pages += o.pinned_pages;
        self.pinned_bytes += o.pinned_bytes;
        self.inserts += o.inserts;
        self.evictions += o.evictions;
        self.quota_evictions += o.quota_evictions;
        self.quota_refusals += o.quota_refusals;
        self.expirations += o.expirations;
        self.pins_refused += o.pins_refused;
    }
}

/// One rule's limits, accounting and Filling count.
#[derive(Clone, Copy, Debug, Default)]
struct RuleState {
    limits: RuleLimits,
    stats: RuleStats,
    /// Slots reserved for the rule and not yet committed or aborted.
    filling: u32,
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
    /// By rule number; entry 0 is "no rule" (never limited).
    rules: Vec<RuleState>,
    /// List `r`: the Ready pages of quota rule `r` not pinned by request,
    /// oldest at the tail.
    rule_lists: SlotLists,
    /// Whether any rule has a TTL (else lookups skip the check).
    has_ttl: bool,
    /// Ready pages pinned by request or by rule.
    pinned_pages: u32,
    /// Rule pins stop when `pinned_pages` reaches this.
    pin_cap: u32,
    /// Dirty Ready pages and their bytes.
    dirty_pages: u32,
    dirty_bytes: u64,
    /// Dirty Ready pages per file id.
    dirty_by_file: BTreeMap<u128, u32>,
}

impl Index {
    /// An index of `nslots` Free slots (`needs_clear == false`), handing out
    /// slot 0 first, without rules. `policy` must be empty and sized for
    /// `nslots`.
    pub fn new(nslots: u32, policy: Box<dyn EvictionPolicy>) -> Self {
        Self::with_rules(nslots, policy, &[])
    }

    /// Like [`Index::new`], enforcing `limits` (indexed by rule number; entry
    /// 0, "no rule", is ignored; see [`crate::rules::Rules::limits`]). Rule
    /// numbers at or past `limits.len()` are treated as rule 0.
    pub fn with_rules(nslots: u32, policy: Box<dyn EvictionPolicy>, limits: &[RuleLimits]) -> Self {
        let n = nslots as usize;
        let mut rules: Vec<RuleState> = limits
            .iter()
            .take(256)
            .map(|&limits| RuleState {
                limits,
                ..RuleState::default()
            })
            .collect();
        if rules.is_empty() {
            rules.push(RuleState::default());
        }
        rules[0].limits = RuleLimits::default();
        let quotas = rules.iter().any(|r| r.limits.quota_pages.is_some());
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
            has_ttl: rules.iter().any(|r| r.limits.ttl_ms.is_some()),
            // Node capacity only where some rule has a quota.
            rule_lists: SlotLists::with_lists(if quotas { nslots } else { 0 }, rules.len()),
            rules,
            pinned_pages: 0,
            pin_cap: (u64::from(nslots) * u64::from(PIN_CAP_PERCENT) / 100) as u32,
            dirty_pages: 0,
            dirty_bytes: 0,
            dirty_by_file: BTreeMap::new(),
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

    /// Number of rule entries, "no rule" included (rule numbers are below it).
    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// Accounting of rule `rule` (rule 0: pages no rule covers). An unknown
    /// rule number reads as rule 0.
    pub fn rule_stats(&self, rule: u8) -> RuleStats {
        self.rules[usize::from(self.known(rule))].stats
    }

    /// The limits enforced for `rule`.
    pub fn rule_limits(&self, rule: u8) -> RuleLimits {
        self.rules[usize::from(self.known(rule))].limits
    }

    /// Whether any rule has a TTL (if not, lookups ignore `now_ms`).
    pub fn has_ttl(&self) -> bool {
        self.has_ttl
    }

    /// Ready pages pinned by request or by rule.
    pub fn pinned_pages(&self) -> u32 {
        self.pinned_pages
    }

    /// Dirty Ready pages.
    pub fn dirty_pages(&self) -> u32 {
        self.dirty_pages
    }

    /// Bytes of the dirty Ready pages.
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_bytes
    }

    /// The files with dirty pages, each with its count of them, in file id order.
    pub fn dirty_files(&self) -> impl Iterator<Item = (u128, u32)> + '_ {
        self.dirty_by_file.iter().map(|(&f, &n)| (f, n))
    }

    /// The dirty pages of `file_id`.
    pub fn dirty_pages_of(&self, file_id: u128) -> u32 {
        self.dirty_by_file.get(&file_id).copied().unwrap_or(0)
    }

    /// Rule pins are refused once this many pages are held.
    pub fn pin_cap(&self) -> u32 {
        self.pin_cap
    }

    /// State of `slot`. Panics if `slot >= nslots`.
    pub fn slot(&self, slot: SlotId) -> &SlotInfo {
        &self.slots[slot as usize]
    }

    /// The slot of a Ready page, expired or not. No side effects.
    pub fn lookup(&self, key: &PageKey) -> Option<SlotId> {
        self.map.get(key).copied()
    }

    /// The slot of a Ready page that is not past its rule's TTL at `now_ms`.
    /// No side effects.
    pub fn lookup_live(&self, key: &PageKey, now_ms: u64) -> Option<SlotId> {
        let slot = *self.map.get(key)?;
        (!self.expired(&self.slots[slot as usize], now_ms)).then_some(slot)
    }

    /// Whether a Ready page has this key (expired or not).
    pub fn contains(&self, key: &PageKey) -> bool {
        self.map.contains_key(key)
    }

    fn known(&self, rule: u8) -> u8 {
        if usize::from(rule) < self.rules.len() {
            rule
        } else {
            NO_RULE
        }
    }

    /// Whether the page in `info` is past its rule's TTL at `now_ms`.
    fn expired(&self, info: &SlotInfo, now_ms: u64) -> bool {
        self.has_ttl
            && self.rules[usize::from(info.rule)]
                .limits
                .ttl_ms
                .is_some_and(|ttl| now_ms.saturating_sub(info.meta.inserted_ms) >= ttl)
    }

    /// A lookup at `now_ms` (the clock `inserted_ms` was taken from). A hit
    /// counts a reader on the page's slot (until [`Index::end_read`]) and
    /// tells the policy (unless held). A page past its rule's TTL is removed
    /// and reported as [`Lookup::Expired`]. Does not allocate.
    pub fn begin_read(&mut self, key: &PageKey, now_ms: u64) -> Lookup {
        let Some(&slot) = self.map.get(key) else {
            self.stats.misses += 1;
            return Lookup::Miss;
        };
        let info = &self.slots[slot as usize];
        if self.expired(info, now_ms) {
            self.stats.misses += 1;
            self.rules[usize::from(info.rule)].stats.expirations += 1;
            self.map.remove(key);
            return Lookup::Expired(self.doom(slot));
        }
        self.stats.hits += 1;
        let info = &mut self.slots[slot as usize];
        info.readers += 1;
        if !info.held() {
            self.policy.access(slot);
        }
        Lookup::Hit(slot, info.meta)
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

    /// [`Index::reserve_for`] a page no rule covers.
    ///
    /// # Errors
    ///
    /// [`ReserveError::Full`]; see [`Index::reserve_for`].
    pub fn reserve(&mut self) -> Result<Reservation, ReserveError> {
        self.reserve_for(NO_RULE)
    }

    /// Reserves a slot for a put of a page of rule `rule`; it becomes Filling
    /// (and counts against the rule's quota until committed or aborted).
    ///
    /// If the rule is at its quota, the rule's oldest page without readers is
    /// evicted and its slot reused. Otherwise takes a Free slot if there is
    /// one (preferring slots whose header needs no clearing), else evicts
    /// through the policy, skipping slots with readers. An evicted page leaves
    /// the map at once; `evicted` names it and `needs_clear` is `true`.
    ///
    /// # Errors
    ///
    /// [`ReserveError::Quota`] if the rule is at its quota and none of its
    /// pages can be evicted; [`ReserveError::Full`] if no slot is Free and
    /// every Ready page is held or being read.
    pub fn reserve_for(&mut self, rule: u8) -> Result<Reservation, ReserveError> {
        let rule = self.known(rule);
        let r = usize::from(rule);
        if let Some(quota) = self.rules[r].limits.quota_pages {
            let st = &self.rules[r];
            if st.stats.pages + u64::from(st.filling) >= u64::from(quota) {
                return self.reserve_within_quota(rule);
            }
        }
        if let Some(slot) = self.pop_free() {
            self.rules[r].filling += 1;
            let info = &mut self.slots[slot as usize];
            info.state = SlotState::Filling;
            info.pinned = false;
            info.rule_pinned = false;
            info.rule = rule;
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
        debug_assert!(
            {
                let info = &self.slots[slot as usize];
                info.state == SlotState::Ready && !info.held() && info.readers == 0
            },
            "policy evicted slot {slot} in state {:?}",
            self.slots[slot as usize]
        );
        let victim = usize::from(self.slots[slot as usize].rule);
        self.rules[victim].stats.evictions += 1;
        Ok(self.evict_into(slot, rule))
    }

    /// The rule is at its quota: its oldest page without readers makes room.
    fn reserve_within_quota(&mut self, rule: u8) -> Result<Reservation, ReserveError> {
        let r = usize::from(rule);
        let mut cur = self.rule_lists.tail(r);
        while let Some(slot) = cur {
            if self.slots[slot as usize].readers == 0 {
                self.rules[r].stats.quota_evictions += 1;
                return Ok(self.evict_into(slot, rule));
            }
            cur = self.rule_lists.newer(slot);
        }
        self.rules[r].stats.quota_refusals += 1;
        Err(ReserveError::Quota { rule })
    }

    /// Evicts the Ready, unread `slot` and makes it Filling for `rule`.
    fn evict_into(&mut self, slot: SlotId, rule: u8) -> Reservation {
        self.stats.evictions += 1;
        let key = self.slots[slot as usize].key;
        self.map.remove(&key);
        self.take_out(slot);
        self.rules[usize::from(rule)].filling += 1;
        let info = &mut self.slots[slot as usize];
        info.state = SlotState::Filling;
        info.pinned = false;
        info.rule_pinned = false;
        info.dirty = false;
        info.rule = rule;
        info.needs_clear = true;
        Reservation {
            slot,
            needs_clear: true,
            evicted: Some(key),
        }
    }

    /// Publishes the Filling `slot` as `key`; it becomes Ready, enters the map
    /// and, unless held, the policy. Its rule is the one it was reserved for;
    /// `pinned` is the pin by request (a pin rule may pin it too).
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
        self.commit_with(slot, key, meta, pinned, false)
    }

    /// [`Index::commit`] of a page that is `dirty` or not (a dirty page is
    /// never evicted; see the module docs).
    ///
    /// # Panics
    ///
    /// If `slot` is not Filling.
    pub fn commit_with(
        &mut self,
        slot: SlotId,
        key: PageKey,
        meta: PageMeta,
        pinned: bool,
        dirty: bool,
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
        let rule = self.slots[slot as usize].rule;
        let st = &mut self.rules[usize::from(rule)];
        st.filling = st.filling.saturating_sub(1);
        st.stats.inserts += 1;
        self.publish(slot, key, meta, pinned, dirty, rule);
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
        let st = &mut self.rules[usize::from(info.rule)];
        st.filling = st.filling.saturating_sub(1);
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

    /// Demotes the pages of `file_id` that may be evicted (clean, not held): they go before
    /// every other page ([`EvictionPolicy::demote`]). Returns how many. No I/O: the order of
    /// eviction is not kept on disk.
    pub fn demote_file(&mut self, file_id: u128) -> usize {
        let range = PageKey::new(file_id, 0)..=PageKey::new(file_id, u64::MAX);
        let mut n = 0;
        for &slot in self.map.range(range).map(|(_, s)| s) {
            if self.policy.contains(slot) {
                self.policy.demote(slot);
                n += 1;
            }
        }
        n
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

    /// Pins or unpins a Ready `key` by request. A held page leaves the policy
    /// (never evicted); a page no longer held re-enters it. A page its rule
    /// pins stays held when unpinned. Returns the slot, or `None` if the key
    /// is absent.
    pub fn set_pinned(&mut self, key: &PageKey, pinned: bool) -> Option<SlotId> {
        let slot = *self.map.get(key)?;
        let info = self.slots[slot as usize];
        if info.pinned == pinned {
            return Some(slot);
        }
        let r = usize::from(info.rule);
        let len = u64::from(info.meta.len);
        let quota = self.rules[r].limits.quota_pages.is_some();
        self.slots[slot as usize].pinned = pinned;
        if pinned {
            // Pinned by request: out of reach of the quota too.
            self.rule_lists.unlink(slot);
        } else if quota && !info.dirty {
            self.rule_lists.push_front(r, slot, key.hash64());
        }
        if !info.rule_pinned {
            let st = &mut self.rules[r].stats;
            if pinned {
                if !info.dirty {
                    self.policy.remove(slot);
                }
                self.pinned_pages += 1;
                st.pinned_pages += 1;
                st.pinned_bytes += len;
            } else {
                if !info.dirty {
                    self.policy.insert(slot, key.hash64());
                }
                self.pinned_pages -= 1;
                st.pinned_pages -= 1;
                st.pinned_bytes -= len;
            }
        }
        Some(slot)
    }

    /// Marks a Ready `key` dirty (never evicted) or clean (an ordinary cached
    /// page again). Returns the slot, or `None` if the key is absent.
    pub fn set_dirty(&mut self, key: &PageKey, dirty: bool) -> Option<SlotId> {
        let slot = *self.map.get(key)?;
        let info = self.slots[slot as usize];
        if info.dirty == dirty {
            return Some(slot);
        }
        let r = usize::from(info.rule);
        let quota = self.rules[r].limits.quota_pages.is_some();
        self.count_dirty(key.file_id, u64::from(info.meta.len), dirty);
        self.slots[slot as usize].dirty = dirty;
        if dirty {
            if !info.pinned_any() {
                self.policy.remove(slot);
            }
            self.rule_lists.unlink(slot);
        } else {
            if !info.pinned_any() {
                self.policy.insert(slot, key.hash64());
            }
            if quota && !info.pinned {
                self.rule_lists.push_front(r, slot, key.hash64());
            }
        }
        Some(slot)
    }

    /// Adds (`dirty`) or takes away one dirty page of `len` bytes of `file`.
    fn count_dirty(&mut self, file: u128, len: u64, dirty: bool) {
        if dirty {
            self.dirty_pages += 1;
            self.dirty_bytes += len;
            *self.dirty_by_file.entry(file).or_insert(0) += 1;
        } else {
            self.dirty_pages -= 1;
            self.dirty_bytes -= len;
            if let Some(n) = self.dirty_by_file.get_mut(&file) {
                *n -= 1;
                if *n == 0 {
                    self.dirty_by_file.remove(&file);
                }
            }
        }
    }

    /// Start-up: marks the Free `slot` Ready with a page of rule `rule` found
    /// on disk (`pinned`: its pin by request). The caller restores in
    /// ascending `inserted_ms` order, then calls [`Index::enforce_quotas`].
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
        rule: u8,
    ) -> Option<SlotId> {
        self.restore_with(slot, key, meta, pinned, false, rule)
    }

    /// [`Index::restore`] of a page found `dirty` on disk or not.
    ///
    /// # Panics
    ///
    /// If `slot` is not Free.
    pub fn restore_with(
        &mut self,
        slot: SlotId,
        key: PageKey,
        meta: PageMeta,
        pinned: bool,
        dirty: bool,
        rule: u8,
    ) -> Option<SlotId> {
        let was_free = self.take_free(slot);
        assert!(was_free, "restore of slot {slot} that is not Free");
        let rule = self.known(rule);
        let info = &mut self.slots[slot as usize];
        info.state = SlotState::Filling;
        let Some(&old) = self.map.get(&key) else {
            self.publish(slot, key, meta, pinned, dirty, rule);
            return None;
        };
        self.stats.displaced += 1;
        if meta.inserted_ms >= self.slots[old as usize].meta.inserted_ms {
            self.map.remove(&key);
            self.doom(old);
            self.publish(slot, key, meta, pinned, dirty, rule);
            Some(old)
        } else {
            let info = &mut self.slots[slot as usize];
            info.state = SlotState::Doomed;
            info.key = key;
            info.meta = meta;
            info.pinned = pinned;
            info.rule_pinned = false;
            info.dirty = false;
            info.rule = rule;
            info.needs_clear = true;
            Some(slot)
        }
    }

    /// Start-up, after [`Index::restore`]: rules holding more pages than their
    /// quota (a quota lowered since the pages were stored) lose their oldest
    /// pages until they fit. Returns the slots, Doomed with no readers: the
    /// caller clears their headers (or marks them for clearing) and calls
    /// [`Index::reclaimed`]. Counted as quota evictions.
    pub fn enforce_quotas(&mut self) -> Vec<SlotId> {
        let mut out = Vec::new();
        for r in 1..self.rules.len() {
            let Some(quota) = self.rules[r].limits.quota_pages else {
                continue;
            };
            while self.rules[r].stats.pages + u64::from(self.rules[r].filling) > u64::from(quota) {
                let Some(slot) = self.rule_lists.tail(r) else {
                    break;
                };
                if self.slots[slot as usize].readers > 0 {
                    break;
                }
                let key = self.slots[slot as usize].key;
                self.map.remove(&key);
                self.doom(slot);
                self.stats.evictions += 1;
                self.rules[r].stats.quota_evictions += 1;
                out.push(slot);
            }
        }
        out
    }

    /// Keys of Ready pages with their slots, in key order.
    pub fn keys(&self) -> impl Iterator<Item = (&PageKey, SlotId)> {
        self.map.iter().map(|(k, &s)| (k, s))
    }

    /// Name of the eviction policy.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Makes a Filling `slot` Ready as `key` (which must not be mapped), with
    /// rule `rule` (a known rule number).
    fn publish(
        &mut self,
        slot: SlotId,
        key: PageKey,
        meta: PageMeta,
        pinned: bool,
        dirty: bool,
        rule: u8,
    ) {
        let r = usize::from(rule);
        let limits = self.rules[r].limits;
        // A page pinned by request costs the cap nothing more.
        let rule_pinned = limits.pin && (pinned || self.pinned_pages < self.pin_cap);
        let len = u64::from(meta.len);
        let st = &mut self.rules[r].stats;
        if limits.pin && !rule_pinned {
            st.pins_refused += 1;
        }
        st.pages += 1;
        st.bytes += len;
        if pinned || rule_pinned {
            self.pinned_pages += 1;
            st.pinned_pages += 1;
            st.pinned_bytes += len;
        }
        let info = &mut self.slots[slot as usize];
        info.state = SlotState::Ready;
        info.key = key;
        info.meta = meta;
        info.pinned = pinned;
        info.rule_pinned = rule_pinned;
        info.dirty = dirty;
        info.rule = rule;
        info.readers = 0;
        info.needs_clear = true;
        let (held, listed) = (info.held(), info.quota_listed(limits.quota_pages.is_some()));
        self.bytes += len;
        self.map.insert(key, slot);
        if dirty {
            self.count_dirty(key.file_id, len, true);
        }
        if !held {
            self.policy.insert(slot, key.hash64());
        }
        if listed {
            self.rule_lists.push_front(r, slot, key.hash64());
        }
    }

    /// Takes the Ready `slot` out of the accounting, the policy and its
    /// rule's list (eviction and removal alike).
    fn take_out(&mut self, slot: SlotId) {
        let info = &mut self.slots[slot as usize];
        let len = u64::from(info.meta.len);
        let st = &mut self.rules[usize::from(info.rule)].stats;
        st.pages -= 1;
        st.bytes -= len;
        if info.pinned_any() {
            self.pinned_pages -= 1;
            st.pinned_pages -= 1;
            st.pinned_bytes -= len;
        }
        info.rule_pinned = false;
        let (dirty, file) = (info.dirty, info.key.file_id);
        info.dirty = false;
        if dirty {
            self.count_dirty(file, len, false);
        }
        self.bytes -= len;
        self.policy.remove(slot);
        self.rule_lists.unlink(slot);
    }

    /// Makes the Ready `slot` Doomed. The caller has already removed (or
    /// replaced) its map entry.
    fn doom(&mut self, slot: SlotId) -> Removal {
        debug_assert_eq!(self.slots[slot as usize].state, SlotState::Ready);
        self.take_out(slot);
        let info = &mut self.slots[slot as usize];
        info.state = SlotState::Doomed;
        info.needs_clear = true;
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
        info.rule_pinned = false;
        info.dirty = false;
        info.rule = NO_RULE;
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

    /// Panics if any internal invariant is broken (the per-rule accounting
    /// included: it must equal a recount of the slots).
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
        let mut held = 0;
        let mut dirty = (0u32, 0u64);
        let mut dirty_by_file: BTreeMap<u128, u32> = BTreeMap::new();
        let mut recount = vec![RuleStats::default(); self.rules.len()];
        let mut filling = vec![0u32; self.rules.len()];
        for (i, info) in self.slots.iter().enumerate() {
            let slot = i as SlotId;
            let in_policy = self.policy.contains(slot);
            let r = usize::from(info.rule);
            let in_rule_list = self.rule_lists.list_of(slot);
            match info.state {
                SlotState::Free => {
                    assert!(free_seen.contains(&slot), "Free slot {slot} not listed");
                    assert!(!info.held(), "Free slot {slot} pinned");
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
                    assert_eq!(in_policy, !info.held(), "policy membership of {slot}");
                    tracked += usize::from(!info.held());
                    assert!(r < self.rules.len(), "slot {slot} has unknown rule {r}");
                    let c = &mut recount[r];
                    c.pages += 1;
                    c.bytes += u64::from(info.meta.len);
                    if info.dirty {
                        dirty.0 += 1;
                        dirty.1 += u64::from(info.meta.len);
                        *dirty_by_file.entry(info.key.file_id).or_insert(0) += 1;
                    }
                    if info.pinned_any() {
                        held += 1;
                        c.pinned_pages += 1;
                        c.pinned_bytes += u64::from(info.meta.len);
                    }
                    if info.rule_pinned {
                        assert!(self.rules[r].limits.pin, "slot {slot} rule-pinned by {r}");
                    }
                    let listed = info.quota_listed(self.rules[r].limits.quota_pages.is_some());
                    assert_eq!(
                        in_rule_list,
                        listed.then_some(r),
                        "rule list membership of {slot}"
                    );
                }
                SlotState::Filling | SlotState::Doomed => {
                    assert!(!in_policy, "{:?} slot {slot} in policy", info.state);
                    assert_eq!(in_rule_list, None, "{:?} slot {slot} listed", info.state);
                    if info.state == SlotState::Filling {
                        filling[r] += 1;
                    }
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
        assert_eq!(self.pinned_pages, held);
        assert_eq!(
            (self.dirty_pages, self.dirty_bytes),
            dirty,
            "dirty accounting"
        );
        assert_eq!(self.dirty_by_file, dirty_by_file, "dirty pages by file");
        self.rule_lists.check();
        for (r, st) in self.rules.iter().enumerate() {
            let c = &recount[r];
            assert_eq!(
                (st.stats.pages, st.stats.bytes),
                (c.pages, c.bytes),
                "rule {r} pages/bytes"
            );
            assert_eq!(
                (st.stats.pinned_pages, st.stats.pinned_bytes),
                (c.pinned_pages, c.pinned_bytes),
                "rule {r} pinned"
            );
            assert_eq!(st.filling, filling[r], "rule {r} filling");
        }
        assert_eq!(self.rules[0].limits, RuleLimits::default());
    }
}

#[cfg(test)]
mod tests;
