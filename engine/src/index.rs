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
//! again at every start). A page is *held* if either is set: held pages are
//! never chosen by the eviction policy.

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
        rule: NO_RULE,
        readers: 0,
        needs_clear: false,
    };

    /// Pinned by request or by its rule: the policy never evicts it.
    pub fn held(&self) -> bool {
        self.pinned || self.rule_pinned
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
    /// Held Ready pages (pinned by request or by rule).
    pinned_pages: u32,
    /// Rule pins stop when `pinned_pages` reaches this.
    pin_cap: u32,
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

    /// Held Ready pages (pinned by request or by rule).
    pub fn pinned_pages(&self) -> u32 {
        self.pinned_pages
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
        self.publish(slot, key, meta, pinned, rule);
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
        } else if quota {
            self.rule_lists.push_front(r, slot, key.hash64());
        }
        if !info.rule_pinned {
            let st = &mut self.rules[r].stats;
            if pinned {
                self.policy.remove(slot);
                self.pinned_pages += 1;
                st.pinned_pages += 1;
                st.pinned_bytes += len;
            } else {
                self.policy.insert(slot, key.hash64());
                self.pinned_pages -= 1;
                st.pinned_pages -= 1;
                st.pinned_bytes -= len;
            }
        }
        Some(slot)
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
        let was_free = self.take_free(slot);
        assert!(was_free, "restore of slot {slot} that is not Free");
        let rule = self.known(rule);
        let info = &mut self.slots[slot as usize];
        info.state = SlotState::Filling;
        let Some(&old) = self.map.get(&key) else {
            self.publish(slot, key, meta, pinned, rule);
            return None;
        };
        self.stats.displaced += 1;
        if meta.inserted_ms >= self.slots[old as usize].meta.inserted_ms {
            self.map.remove(&key);
            self.doom(old);
            self.publish(slot, key, meta, pinned, rule);
            Some(old)
        } else {
            let info = &mut self.slots[slot as usize];
            info.state = SlotState::Doomed;
            info.key = key;
            info.meta = meta;
            info.pinned = pinned;
            info.rule_pinned = false;
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
    fn publish(&mut self, slot: SlotId, key: PageKey, meta: PageMeta, pinned: bool, rule: u8) {
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
        info.rule = rule;
        info.readers = 0;
        info.needs_clear = true;
        self.bytes += len;
        self.map.insert(key, slot);
        if !(pinned || rule_pinned) {
            self.policy.insert(slot, key.hash64());
        }
        if limits.quota_pages.is_some() && !pinned {
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
        if info.held() {
            self.pinned_pages -= 1;
            st.pinned_pages -= 1;
            st.pinned_bytes -= len;
        }
        info.rule_pinned = false;
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
                    if info.held() {
                        held += 1;
                        c.pinned_pages += 1;
                        c.pinned_bytes += u64::from(info.meta.len);
                    }
                    if info.rule_pinned {
                        assert!(self.rules[r].limits.pin, "slot {slot} rule-pinned by {r}");
                    }
                    let listed = self.rules[r].limits.quota_pages.is_some() && !info.pinned;
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

    impl Index {
        /// `begin_read` without a clock, for indexes without TTL rules.
        fn read(&mut self, key: &PageKey) -> Option<(SlotId, PageMeta)> {
            match self.begin_read(key, 0) {
                Lookup::Hit(slot, meta) => Some((slot, meta)),
                Lookup::Miss => None,
                Lookup::Expired(r) => panic!("expired without a TTL rule: {r:?}"),
            }
        }
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
        assert_eq!(idx.read(&PageKey::new(1, 3)), None);
        assert_eq!(idx.read(&k), Some((0, meta(10, 0))));
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
        idx.read(&a).unwrap();
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
            let (slot, m) = idx.read(&k).unwrap();
            assert_eq!((slot, m.len), (old, 100));
            idx.read(&k).unwrap();
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
        assert_eq!(idx.restore(4, k, meta(10, 100), false, 0), None);
        assert_eq!(idx.restore(2, other, meta(20, 100), true, 0), None);
        idx.check_invariants();
        // A newer copy wins; the older slot is returned Doomed.
        assert_eq!(idx.restore(1, k, meta(30, 200), false, 0), Some(4));
        assert_eq!(idx.slot(4).state, SlotState::Doomed);
        assert_eq!(idx.slot(4).readers, 0);
        assert_eq!(idx.lookup(&k), Some(1));
        assert_eq!(idx.bytes(), 50);
        idx.check_invariants();
        // An older copy (out of order) loses itself.
        assert_eq!(idx.restore(5, k, meta(40, 150), false, 0), Some(5));
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
        idx.read(&PageKey::new(2, 1)).unwrap();
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
        idx.read(&k).unwrap();
        assert_eq!(idx.remove(&k), Removal::Deferred(slots[&k]));
        assert_eq!(idx.read(&k), None);
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
                    let got = self.idx.read(&key(k));
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
                Err(e @ ReserveError::Quota { .. }) => panic!("no rules, yet {e}"),
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

    // ---------------------------------------------------------------------
    // Rules: quota, TTL, pin
    // ---------------------------------------------------------------------

    fn limits(quota: Option<u32>, ttl: Option<u64>, pin: bool) -> RuleLimits {
        RuleLimits {
            quota_pages: quota,
            ttl_ms: ttl,
            pin,
        }
    }

    fn ruled(nslots: u32, l: &[RuleLimits]) -> Index {
        let mut all = vec![RuleLimits::default()];
        all.extend_from_slice(l);
        Index::with_rules(nslots, new_policy(PolicyKind::Lru, nslots), &all)
    }

    /// reserve_for + commit at `now`; returns the reservation.
    fn put_at(idx: &mut Index, key: PageKey, rule: u8, len: u32, now: u64) -> Reservation {
        let r = idx.reserve_for(rule).unwrap();
        let m = PageMeta {
            len,
            version: 1,
            inserted_ms: now,
        };
        assert_eq!(idx.commit(r.slot, key, m, false), None);
        idx.check_invariants();
        r
    }

    #[test]
    fn a_rule_at_quota_evicts_its_own_oldest_page_first() {
        let mut idx = ruled(6, &[limits(Some(2), None, false)]);
        let (a, b, c) = (PageKey::new(1, 0), PageKey::new(1, 1), PageKey::new(1, 2));
        put_at(&mut idx, a, 1, 10, 0);
        put_at(&mut idx, PageKey::new(9, 0), 0, 5, 0);
        put_at(&mut idx, b, 1, 20, 0);
        // Free slots remain, but the rule is at its quota: its oldest page (a) goes.
        let r = put_at(&mut idx, c, 1, 30, 0);
        assert_eq!(r.evicted, Some(a));
        assert!(r.needs_clear);
        let st = idx.rule_stats(1);
        assert_eq!(
            (st.pages, st.bytes, st.quota_evictions, st.inserts),
            (2, 50, 1, 3)
        );
        assert_eq!(idx.rule_stats(0).pages, 1);
        assert_eq!(idx.stats().evictions, 1);
        // A read in flight protects b; c is taken instead.
        assert!(idx.read(&b).is_some());
        let r = put_at(&mut idx, PageKey::new(1, 3), 1, 1, 0);
        assert_eq!(r.evicted, Some(c));
        // Pinned by request and being read: nothing of the rule can go.
        idx.set_pinned(&PageKey::new(1, 3), true);
        assert_eq!(idx.reserve_for(1), Err(ReserveError::Quota { rule: 1 }));
        assert_eq!(idx.rule_stats(1).quota_refusals, 1);
        idx.check_invariants();
        // Other pages are unaffected by the rule's quota.
        put_at(&mut idx, PageKey::new(9, 1), 0, 5, 0);
        assert_eq!(idx.rule_stats(0).pages, 2);
        // An unknown rule number is no rule.
        put_at(&mut idx, PageKey::new(9, 2), 200, 5, 0);
        assert_eq!(idx.rule_stats(0).pages, 3);
        assert_eq!(idx.rule_stats(200), idx.rule_stats(0));
    }

    #[test]
    fn expired_pages_are_misses_and_leave_the_index() {
        let mut idx = ruled(4, &[limits(None, Some(50), false)]);
        assert!(idx.has_ttl());
        let k = PageKey::new(1, 0);
        let r = put_at(&mut idx, k, 1, 10, 100);
        assert_eq!(idx.lookup_live(&k, 149), Some(r.slot));
        match idx.begin_read(&k, 149) {
            Lookup::Hit(slot, _) => assert!(!idx.end_read(slot)),
            other => panic!("{other:?}"),
        }
        assert_eq!(idx.lookup_live(&k, 150), None);
        assert!(idx.contains(&k));
        assert_eq!(
            idx.begin_read(&k, 150),
            Lookup::Expired(Removal::Reclaim(r.slot))
        );
        assert!(!idx.contains(&k));
        idx.reclaimed(r.slot, true);
        assert_eq!(idx.begin_read(&k, 150), Lookup::Miss);
        let st = idx.rule_stats(1);
        assert_eq!((st.pages, st.expirations), (0, 1));
        assert_eq!((idx.stats().hits, idx.stats().misses), (1, 2));
        // An expired page with a reader in flight is removed once the reader is done.
        let r = put_at(&mut idx, k, 1, 10, 200);
        let Lookup::Hit(slot, _) = idx.begin_read(&k, 200) else {
            panic!("hit expected")
        };
        assert_eq!(
            idx.begin_read(&k, 300),
            Lookup::Expired(Removal::Deferred(r.slot))
        );
        assert!(idx.end_read(slot));
        idx.reclaimed(slot, true);
        idx.check_invariants();
        // A clock that went backwards gives age 0, not an expiry.
        put_at(&mut idx, k, 1, 10, 1000);
        assert!(matches!(idx.begin_read(&k, 10), Lookup::Hit(..)));
    }

    #[test]
    fn pin_rules_stop_at_the_cap_and_count_the_rest() {
        let mut idx = ruled(10, &[limits(None, None, true)]);
        assert_eq!(idx.pin_cap(), 9);
        for i in 0..10 {
            put_at(&mut idx, PageKey::new(1, i), 1, 100, 0);
        }
        let st = idx.rule_stats(1);
        assert_eq!((st.pages, st.pinned_pages, st.pinned_bytes), (10, 9, 900));
        assert_eq!(st.pins_refused, 1);
        // Only the page past the cap can be evicted, then nothing.
        let r = idx.reserve().unwrap();
        assert_eq!(r.evicted, Some(PageKey::new(1, 9)));
        assert_eq!(idx.rule_stats(1).evictions, 1);
        idx.abort(r.slot, true);
        idx.reserve().unwrap();
        assert_eq!(idx.reserve(), Err(ReserveError::Full));
        // Unpinning by request does not unpin what the rule pins.
        idx.set_pinned(&PageKey::new(1, 0), true);
        idx.set_pinned(&PageKey::new(1, 0), false);
        assert!(idx.slot(idx.lookup(&PageKey::new(1, 0)).unwrap()).held());
        idx.check_invariants();
    }

    #[test]
    fn restore_reproduces_the_accounting_and_trims_lowered_quotas() {
        let l = [limits(Some(3), None, false), limits(None, Some(10), true)];
        let mut idx = ruled(8, &l);
        for i in 0..3 {
            put_at(&mut idx, PageKey::new(1, i), 1, 10 + i as u32, i);
        }
        for i in 0..2 {
            put_at(&mut idx, PageKey::new(2, i), 2, 7, 5);
        }
        put_at(&mut idx, PageKey::new(3, 0), 0, 1, 6);
        idx.set_pinned(&PageKey::new(3, 0), true);
        let pages: Vec<(SlotId, SlotInfo)> = idx.keys().map(|(_, s)| (s, *idx.slot(s))).collect();
        let replay = |l: &[RuleLimits]| {
            let mut fresh = ruled(8, l);
            let mut sorted = pages.clone();
            sorted.sort_by_key(|(s, i)| (i.meta.inserted_ms, *s));
            for (s, i) in &sorted {
                assert_eq!(fresh.restore(*s, i.key, i.meta, i.pinned, i.rule), None);
            }
            let trimmed = fresh.enforce_quotas();
            for s in &trimmed {
                fresh.reclaimed(*s, false);
            }
            fresh.check_invariants();
            (fresh, trimmed)
        };
        let (same, trimmed) = replay(&l);
        assert!(trimmed.is_empty());
        for r in 0..3 {
            let (a, b) = (idx.rule_stats(r), same.rule_stats(r));
            assert_eq!(
                (a.pages, a.bytes, a.pinned_pages, a.pinned_bytes),
                (b.pages, b.bytes, b.pinned_pages, b.pinned_bytes),
                "rule {r}"
            );
        }
        assert_eq!(same.pinned_pages(), idx.pinned_pages());
        // The quota lowered to 1 page: the two oldest pages of the rule go.
        let (low, trimmed) = replay(&[limits(Some(1), None, false), l[1]]);
        assert_eq!(trimmed.len(), 2);
        assert_eq!(low.rule_stats(1).pages, 1);
        assert_eq!(low.rule_stats(1).quota_evictions, 2);
        assert!(low.contains(&PageKey::new(1, 2)));
    }

    /// Rules of the property test: rule of key k is `k % 6`.
    fn prop_limits() -> Vec<RuleLimits> {
        vec![
            RuleLimits::default(),
            limits(Some(3), None, false),
            limits(None, None, true),
            limits(None, Some(50), false),
            limits(Some(2), None, true),
            limits(Some(2), Some(30), false),
        ]
    }

    const RSLOTS: u32 = 6;
    const RKEYS: u64 = 30;

    #[derive(Clone, Debug)]
    enum ROp {
        Put { key: u64, outcome: u8 },
        Read(u64),
        Finish(usize),
        Remove(u64),
        RemoveFile(u64),
        Pin(u64, bool),
        Advance(u64),
        Restart,
    }

    fn rop() -> impl Strategy<Value = ROp> {
        prop_oneof![
            8 => (0..RKEYS, 0u8..8).prop_map(|(key, outcome)| ROp::Put { key, outcome }),
            4 => (0..RKEYS).prop_map(ROp::Read),
            3 => any::<usize>().prop_map(ROp::Finish),
            1 => (0..RKEYS).prop_map(ROp::Remove),
            1 => (0..NFILES).prop_map(ROp::RemoveFile),
            2 => (0..RKEYS, any::<bool>()).prop_map(|(k, p)| ROp::Pin(k, p)),
            3 => (0u64..40).prop_map(ROp::Advance),
            1 => Just(ROp::Restart),
        ]
    }

    #[derive(Clone, Copy, Debug)]
    struct RPage {
        slot: SlotId,
        pinned: bool,
        inserted: u64,
        /// When it (re-)entered its rule's list (insertion order).
        seq: u64,
    }

    struct RHarness {
        idx: Index,
        limits: Vec<RuleLimits>,
        present: BTreeMap<u64, RPage>,
        readers: Vec<(u64, SlotId)>,
        now: u64,
        seq: u64,
    }

    fn rule_of(k: u64) -> u8 {
        (k % 6) as u8
    }

    impl RHarness {
        fn busy(&self, slot: SlotId) -> bool {
            self.readers.iter().any(|&(_, s)| s == slot)
        }

        fn expired(&self, k: u64, p: &RPage) -> bool {
            self.limits[usize::from(rule_of(k))]
                .ttl_ms
                .is_some_and(|t| self.now.saturating_sub(p.inserted) >= t)
        }

        /// A removal the index reported: reclaim now, or leave it to the last reader.
        fn removed(&mut self, k: u64, got: Removal) {
            let p = self.present.remove(&k).expect("removed a present page");
            if self.busy(p.slot) {
                assert_eq!(got, Removal::Deferred(p.slot));
            } else {
                assert_eq!(got, Removal::Reclaim(p.slot));
                self.idx.reclaimed(p.slot, true);
            }
        }

        fn apply(&mut self, op: &ROp) {
            match *op {
                ROp::Put { key: k, outcome } => self.put(k, outcome),
                ROp::Read(k) => {
                    let live = self.idx.lookup_live(&key(k), self.now);
                    let got = self.idx.begin_read(&key(k), self.now);
                    match self.present.get(&k).copied() {
                        None => assert_eq!(got, Lookup::Miss),
                        Some(p) if self.expired(k, &p) => {
                            assert_eq!(live, None);
                            assert!(matches!(got, Lookup::Expired(_)), "{got:?}");
                            let Lookup::Expired(r) = got else {
                                unreachable!()
                            };
                            self.removed(k, r);
                        }
                        Some(p) => {
                            assert_eq!(live, Some(p.slot));
                            assert!(matches!(got, Lookup::Hit(s, _) if s == p.slot), "{got:?}");
                            self.readers.push((k, p.slot));
                        }
                    }
                }
                ROp::Finish(i) => {
                    if self.readers.is_empty() {
                        return;
                    }
                    let (k, slot) = self.readers.swap_remove(i % self.readers.len());
                    let live = self.present.get(&k).is_some_and(|p| p.slot == slot);
                    let want = !live && !self.busy(slot);
                    assert_eq!(self.idx.end_read(slot), want);
                    if want {
                        self.idx.reclaimed(slot, true);
                    }
                }
                ROp::Remove(k) => {
                    let got = self.idx.remove(&key(k));
                    if self.present.contains_key(&k) {
                        self.removed(k, got);
                    } else {
                        assert_eq!(got, Removal::NotFound);
                    }
                }
                ROp::RemoveFile(f) => {
                    let (reclaim, _) = self.idx.remove_file(u128::from(f));
                    for s in reclaim {
                        self.idx.reclaimed(s, true);
                    }
                    self.present.retain(|k, _| k % NFILES != f);
                }
                ROp::Pin(k, pin) => {
                    let got = self.idx.set_pinned(&key(k), pin);
                    self.seq += 1;
                    let seq = self.seq;
                    match self.present.get_mut(&k) {
                        None => assert_eq!(got, None),
                        Some(p) => {
                            assert_eq!(got, Some(p.slot));
                            if p.pinned && !pin {
                                p.seq = seq;
                            }
                            p.pinned = pin;
                        }
                    }
                }
                ROp::Advance(ms) => self.now += ms,
                ROp::Restart => self.restart(),
            }
        }

        fn put(&mut self, k: u64, outcome: u8) {
            let rule = rule_of(k);
            let quota = self.limits[usize::from(rule)].quota_pages;
            let before: BTreeMap<PageKey, SlotInfo> = self
                .idx
                .keys()
                .map(|(k, s)| (*k, *self.idx.slot(s)))
                .collect();
            let r = match self.idx.reserve_for(rule) {
                Err(ReserveError::Full) => {
                    let evictable = before.values().any(|i| !i.held() && !self.busy_slot(i));
                    assert!(self.idx.free_count() == 0 && !evictable, "Full wrongly");
                    return;
                }
                Err(ReserveError::Quota { rule: r }) => {
                    assert_eq!(r, rule);
                    let q = quota.expect("refused by a rule without a quota");
                    let st = self.idx.rule_stats(rule);
                    assert!(
                        st.pages + u64::from(self.idx.rules[usize::from(rule)].filling)
                            >= u64::from(q)
                    );
                    let candidate = before
                        .values()
                        .any(|i| i.rule == rule && !i.pinned && !self.busy_slot(i));
                    assert!(
                        !candidate,
                        "quota refusal with an evictable page of the rule"
                    );
                    return;
                }
                Ok(r) => r,
            };
            if let Some(victim) = r.evicted {
                let v = before[&victim];
                assert!(!v.pinned, "evicted a page pinned by request");
                assert_eq!(v.readers, 0, "evicted a page being read");
                let vk = (0..RKEYS).find(|&x| key(x) == victim).unwrap();
                let vp = self.present.remove(&vk).unwrap();
                let at_quota = quota.is_some_and(|q| {
                    before.values().filter(|i| i.rule == rule).count() as u64 >= u64::from(q)
                });
                if at_quota {
                    // The rule's own oldest evictable page.
                    assert_eq!(v.rule, rule, "quota eviction took another rule's page");
                    let oldest = self
                        .present
                        .iter()
                        .filter(|(x, p)| rule_of(**x) == rule && !p.pinned && !self.busy(p.slot))
                        .map(|(_, p)| p.seq)
                        .min();
                    assert!(
                        oldest.is_none_or(|o| o > vp.seq),
                        "not the oldest of the rule"
                    );
                } else {
                    assert!(!v.rule_pinned, "the policy evicted a page its rule pins");
                }
            }
            if outcome < 2 {
                self.idx.abort(r.slot, outcome == 0);
                return;
            }
            let explicit = self.present.get(&k).is_some_and(|p| p.pinned);
            let m = PageMeta {
                len: 1 + k as u32 * 3 + u32::from(outcome),
                version: self.seq,
                inserted_ms: self.now,
            };
            if let Some(old) = self.idx.commit(r.slot, key(k), m, explicit) {
                self.idx.reclaimed(old, true);
            }
            self.seq += 1;
            self.present.insert(
                k,
                RPage {
                    slot: r.slot,
                    pinned: explicit,
                    inserted: self.now,
                    seq: self.seq,
                },
            );
            let info = *self.idx.slot(r.slot);
            let lim = self.limits[usize::from(rule)];
            if lim.pin && !info.rule_pinned {
                assert!(
                    self.idx.pinned_pages() >= self.idx.pin_cap(),
                    "pin refused below the cap"
                );
            }
            if info.rule_pinned && !explicit {
                assert!(
                    self.idx.pinned_pages() <= self.idx.pin_cap(),
                    "pinned past the cap"
                );
            }
        }

        fn busy_slot(&self, i: &SlotInfo) -> bool {
            i.readers > 0
        }

        /// A restart: a fresh index restored from the Ready pages (oldest first) must hold the
        /// same pages with the same accounting.
        fn restart(&mut self) {
            if !self.readers.is_empty() {
                return;
            }
            let mut pages: Vec<(SlotId, SlotInfo)> = self
                .idx
                .keys()
                .map(|(_, s)| (s, *self.idx.slot(s)))
                .collect();
            pages.sort_by_key(|(s, i)| (i.meta.inserted_ms, *s));
            let mut fresh =
                Index::with_rules(RSLOTS, new_policy(PolicyKind::Lru, RSLOTS), &self.limits);
            for (s, i) in &pages {
                assert_eq!(fresh.restore(*s, i.key, i.meta, i.pinned, i.rule), None);
            }
            assert!(
                fresh.enforce_quotas().is_empty(),
                "quota exceeded before the restart"
            );
            fresh.check_invariants();
            for r in 0..self.limits.len() as u8 {
                let (a, b) = (self.idx.rule_stats(r), fresh.rule_stats(r));
                assert_eq!((a.pages, a.bytes), (b.pages, b.bytes), "rule {r}");
            }
            // Pages restored in (inserted_ms, slot) order get that order in their rule lists.
            let order: Vec<SlotId> = pages.iter().map(|(s, _)| *s).collect();
            for p in self.present.values_mut() {
                let rank = order.iter().position(|&s| s == p.slot).unwrap() as u64;
                p.seq = rank;
            }
            self.seq = self.seq.max(order.len() as u64 + 1);
            self.idx = fresh;
        }

        fn check(&self) {
            self.idx.check_invariants();
            assert_eq!(self.idx.len(), self.present.len());
            for (r, l) in self.limits.iter().enumerate() {
                if let Some(q) = l.quota_pages {
                    let st = self.idx.rule_stats(r as u8);
                    let filling = self.idx.rules[r].filling;
                    assert!(
                        st.pages + u64::from(filling) <= u64::from(q),
                        "rule {r} holds {} + {filling} pages, quota {q}",
                        st.pages
                    );
                }
            }
            for (k, p) in &self.present {
                let i = self.idx.slot(p.slot);
                assert_eq!(i.key, key(*k));
                assert_eq!(i.pinned, p.pinned);
                assert_eq!(i.rule, rule_of(*k));
            }
        }
    }

    fn run_rules(ops: &[ROp]) {
        let limits = prop_limits();
        let mut h = RHarness {
            idx: Index::with_rules(RSLOTS, new_policy(PolicyKind::Lru, RSLOTS), &limits),
            limits,
            present: BTreeMap::new(),
            readers: Vec::new(),
            now: 1000,
            seq: 0,
        };
        for op in ops {
            h.apply(op);
            h.check();
        }
        while let Some((k, slot)) = h.readers.pop() {
            let live = h.present.get(&k).is_some_and(|p| p.slot == slot);
            let want = !live && !h.busy(slot);
            assert_eq!(h.idx.end_read(slot), want);
            if want {
                h.idx.reclaimed(slot, true);
            }
        }
        h.restart();
        h.check();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Quotas are never exceeded, held pages are never evicted by the policy, a quota
        /// evicts its rule's oldest page, expired pages are never served, the accounting
        /// equals a recount after every operation, and a restore reproduces it.
        #[test]
        fn rules_hold_under_any_operation_sequence(ops in prop::collection::vec(rop(), 1..200)) {
            run_rules(&ops);
        }
    }
}
