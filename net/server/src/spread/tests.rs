use super::*;
use proptest::prelude::*;

fn config() -> SpreadConfig {
    SpreadConfig {
        spread: 3,
        threshold: 10.0,
        half_life: Duration::from_secs(1),
        cool: Duration::from_secs(5),
        max_pages: 4,
    }
}

/// `n` reads of one page, evenly over `secs` seconds from `t0`; the spread of the last one.
fn reads(h: &mut HotPages, file: u128, page: u64, t0: Instant, n: u32, secs: f64) -> (u8, Instant) {
    let mut last = (0, t0);
    for i in 0..n {
        let at = t0 + Duration::from_secs_f64(secs * f64::from(i) / f64::from(n));
        last = (h.record(file, page, at), at);
    }
    last
}

#[test]
fn a_page_read_above_the_threshold_turns_hot_and_one_below_it_does_not() {
    let t0 = Instant::now();
    let mut h = HotPages::new(config());
    // 5 reads a second for 10 s: half the threshold, never hot.
    let (s, at) = reads(&mut h, 1, 0, t0, 50, 10.0);
    assert_eq!(s, 0);
    assert_eq!(h.counts(at), (0, 0));
    // 40 a second: hot within the first second or two, and says over how many members.
    let (s, at) = reads(&mut h, 2, 7, t0, 80, 2.0);
    assert_eq!(s, 3);
    assert!(h.is_hot(2, 7));
    assert!(!h.is_hot(2, 8) && !h.is_hot(1, 0));
    assert_eq!(h.counts(at), (1, 1));
    assert_eq!(h.spread_of(2, 7, at), 3);
    assert_eq!(h.spread_of(2, 8, at), 0);
}

#[test]
fn a_hot_page_stays_hot_at_a_third_of_its_reads_and_cools_when_they_stop() {
    let t0 = Instant::now();
    let mut h = HotPages::new(config());
    let (s, at) = reads(&mut h, 9, 1, t0, 60, 1.0);
    assert_eq!(s, 3);
    // Readers spread over 3 members: the owner sees 20 of 60 reads a second, still hot.
    let (s, at) = reads(&mut h, 9, 1, at, 100, 5.0);
    assert_eq!(s, 3, "the owner must not lose the flag once readers spread");
    // Nobody reads for 10 s (10 half-lives): the count is far below the cooling point.
    let later = at + Duration::from_secs(10);
    assert_eq!(h.spread_of(9, 1, later), 0);
    assert_eq!(h.counts(later).0, 0);
    // The next single read finds it cold.
    assert_eq!(h.record(9, 1, later), 0);
    assert!(!h.is_hot(9, 1));
}

#[test]
fn turned_off_replicas_report_nothing() {
    let t0 = Instant::now();
    for off in [
        SpreadConfig {
            spread: 1,
            ..config()
        },
        SpreadConfig {
            threshold: 0.0,
            ..config()
        },
    ] {
        assert!(!off.enabled());
        let mut h = HotPages::new(off);
        let (s, _) = reads(&mut h, 1, 1, t0, 1000, 1.0);
        assert_eq!(s, 0);
    }
}

#[test]
fn a_slot_is_taken_over_only_once_its_page_has_decayed() {
    let t0 = Instant::now();
    let mut h = HotPages::new(config());
    // Find two pages of one file that share a slot.
    let a = 0u64;
    let b = (1..u64::MAX)
        .find(|p| slot_of(5, *p) == slot_of(5, a))
        .unwrap();
    let (s, at) = reads(&mut h, 5, a, t0, 40, 1.0);
    assert_eq!(s, 3);
    // While `a` counts, `b` is not tracked, however often it is read.
    let (s, _) = reads(&mut h, 5, b, at, 100, 1.0);
    assert_eq!(s, 0);
    assert!(h.is_hot(5, a));
    // Long after `a`'s last read its count is below one: `b` takes the slot and can turn hot.
    let later = at + Duration::from_secs(30);
    let (s, _) = reads(&mut h, 5, b, later, 40, 1.0);
    assert_eq!(s, 3);
    assert!(!h.is_hot(5, a));
}

#[test]
fn copies_are_bounded_and_dropped_once_unread_for_the_cooling_time() {
    let t0 = Instant::now();
    let mut r = Replicas::new(config());
    let k = |p| CopyKey {
        file_id: 1,
        page: p,
    };
    for p in 0..4 {
        assert!(r.copied(k(p), t0));
    }
    assert!(!r.has_room());
    assert!(!r.copied(k(4), t0), "past max_pages nothing more is kept");
    assert!(!r.holds(&k(4)));
    // A copy made again (already held) only refreshes it.
    assert!(r.copied(k(0), t0));
    // Pages 0 and 1 are read at 4 s; 2 and 3 are not.
    r.read(k(0), t0 + Duration::from_secs(4));
    r.read(k(1), t0 + Duration::from_secs(4));
    assert_eq!(r.cooled(t0 + Duration::from_secs(4)), vec![]);
    assert_eq!(r.cooled(t0 + Duration::from_secs(5)), vec![k(2), k(3)]);
    assert!(r.has_room());
    assert_eq!(r.cooled(t0 + Duration::from_secs(9)), vec![k(0), k(1)]);
    assert_eq!(
        r.counts(),
        ReplicaCounts {
            held: 0,
            copied: 4,
            dropped: 4,
            reads: 2
        }
    );
    r.copied(k(7), t0);
    r.copied(
        CopyKey {
            file_id: 2,
            page: 7,
        },
        t0,
    );
    r.forget_file(1);
    assert_eq!(r.counts().held, 1);
}

proptest! {
    /// Any read pattern: `hot_now` never exceeds the pages that turned hot, a page is reported
    /// hot only while its own rate says so, and the spread is 0 or the configured one.
    #[test]
    fn any_read_pattern_keeps_the_table_consistent(
        ops in prop::collection::vec((0u128..4, 0u64..64, 0u64..400), 1..400),
    ) {
        let t0 = Instant::now();
        let mut h = HotPages::new(config());
        let mut now = t0;
        for (file, page, gap_ms) in ops {
            now += Duration::from_millis(gap_ms);
            let s = h.record(file, page, now);
            prop_assert!(s == 0 || s == 3);
            prop_assert_eq!(s == 3, h.is_hot(file, page));
            let (hot, turned) = h.counts(now);
            prop_assert!(u64::from(hot) <= turned);
            prop_assert!(hot as usize <= RATE_SLOTS);
        }
    }
}
