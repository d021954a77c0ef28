//! Hot pages as this client knows them: which pages an owner said readers should spread, and
//! over how many members (`Data::spread`, protocol version 5). A read of such a page goes to one
//! of those members in turn; the owner's next answer renews or ends the entry. Entries expire
//! after [`HOT_TTL`] without news from the owner, and the table holds at most [`MAX_HOT`] (when
//! full, expired entries go first, then the whole table: a client that forgets a hot page only
//! asks its owner again).

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
    time::{Duration, Instant},
};

/// How long an owner's word that a page is hot holds without being renewed.
pub const HOT_TTL: Duration = Duration::from_secs(10);
/// Hot pages one client remembers at most.
pub const MAX_HOT: usize = 4096;

/// The hot pages this client spreads (see the module docs).
#[derive(Default)]
pub struct HotMap {
    pages: Mutex<HashMap<(u128, u64), (u8, Instant)>>,
    turn: AtomicU64,
}

impl HotMap {
    /// The members page `page` of `file_id` is spread over at `now` (0 or 1: read the owner).
    pub fn spread_of(&self, file_id: u128, page: u64, now: Instant) -> u8 {
        let pages = self.pages.lock().unwrap_or_else(|p| p.into_inner());
        match pages.get(&(file_id, page)) {
            Some((spread, until)) if now < *until => *spread,
            _ => 0,
        }
    }

    /// Which of the first `spread` members the next read of `page` goes to (0 is the owner):
    /// in turn, so that one client's reads of the page are spread evenly.
    pub fn pick(&self, page: u64, spread: u8) -> usize {
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        (turn.wrapping_add(page) % u64::from(spread.max(1))) as usize
    }

    /// What the owner answered at `now`: the page is spread over `spread` members (2 or more),
    /// or not hot (fewer).
    pub fn owner_said(&self, file_id: u128, page: u64, spread: u8, now: Instant) {
        let mut pages = self.pages.lock().unwrap_or_else(|p| p.into_inner());
        if spread < 2 {
            pages.remove(&(file_id, page));
            return;
        }
        if pages.len() >= MAX_HOT && !pages.contains_key(&(file_id, page)) {
            pages.retain(|_, (_, until)| now < *until);
            if pages.len() >= MAX_HOT {
                pages.clear();
            }
        }
        pages.insert((file_id, page), (spread, now + HOT_TTL));
    }

    /// A member that was asked for the page as a replica could not serve it: read the owner
    /// until it says again that the page is hot.
    pub fn forget(&self, file_id: u128, page: u64) {
        let mut pages = self.pages.lock().unwrap_or_else(|p| p.into_inner());
        pages.remove(&(file_id, page));
    }

    /// Pages this client spreads now.
    pub fn len(&self, now: Instant) -> usize {
        let pages = self.pages.lock().unwrap_or_else(|p| p.into_inner());
        pages.values().filter(|(_, until)| now < *until).count()
    }

    /// Whether this client spreads no page now.
    pub fn is_empty(&self, now: Instant) -> bool {
        self.len(now) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_makes_a_page_hot_renews_it_and_ends_it() {
        let m = HotMap::default();
        let t0 = Instant::now();
        assert_eq!(m.spread_of(1, 2, t0), 0);
        m.owner_said(1, 2, 3, t0);
        assert_eq!(m.spread_of(1, 2, t0), 3);
        assert_eq!(m.spread_of(1, 3, t0), 0);
        // It expires without news, and is renewed by news.
        assert_eq!(m.spread_of(1, 2, t0 + HOT_TTL), 0);
        m.owner_said(1, 2, 3, t0 + HOT_TTL);
        assert_eq!(m.spread_of(1, 2, t0 + HOT_TTL), 3);
        assert_eq!(m.len(t0 + HOT_TTL), 1);
        // The owner says it cooled (0), or a replica failed it.
        m.owner_said(1, 2, 0, t0);
        assert!(m.is_empty(t0));
        m.owner_said(1, 2, 2, t0);
        m.forget(1, 2);
        assert_eq!(m.spread_of(1, 2, t0), 0);
        // A spread of 1 is the owner alone: nothing to remember.
        m.owner_said(4, 4, 1, t0);
        assert!(m.is_empty(t0));
    }

    #[test]
    fn picks_cover_every_member_evenly() {
        let m = HotMap::default();
        let mut seen = [0usize; 3];
        for _ in 0..300 {
            seen[m.pick(7, 3)] += 1;
        }
        assert_eq!(seen, [100, 100, 100]);
        assert_eq!(m.pick(7, 0), 0);
        assert_eq!(m.pick(7, 1), 0);
    }

    #[test]
    fn the_table_is_bounded() {
        let m = HotMap::default();
        let t0 = Instant::now();
        for p in 0..MAX_HOT as u64 {
            m.owner_said(1, p, 2, t0);
        }
        assert_eq!(m.len(t0), MAX_HOT);
        // Full of live entries: a new one empties it first.
        m.owner_said(2, 0, 2, t0);
        assert_eq!(m.len(t0), 1);
        // Full of expired entries: they go, the live ones stay.
        for p in 0..MAX_HOT as u64 - 1 {
            m.owner_said(3, p, 2, t0 - HOT_TTL);
        }
        m.owner_said(4, 0, 2, t0);
        assert_eq!(m.len(t0), 2);
    }
}
