//! How long the client waits for a member: an estimate of each member's usual answer time, and
//! from it the silence after which a member that answers nothing at all is given up on.
//!
//! A fixed call timeout makes every reader with a request on a dead node wait it out (3 s by
//! default). Instead, a request is abandoned when its member has been silent (answered no
//! request of this client) for a multiple of its usual latency: a killed node is left within a
//! fraction of a second, while a node that is merely busy keeps answering other requests and
//! keeps its readers. Pure state, no clock of its own and no I/O: the caller passes the times.
//!
//! The same estimate says when a request is late enough to be hedged (asked of a second source
//! as well: [`Latency::hedge_delay`]), and [`HedgeBudget`] bounds how many requests may be.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

/// Smoothed answer time and its variation (as TCP's retransmission timer keeps them, RFC 6298:
/// gains 1/8 and 1/4), and when the member last answered.
#[derive(Clone, Copy, Debug)]
pub struct Latency {
    srtt: Duration,
    rttvar: Duration,
    last_answer: Instant,
    /// When the member last failed to answer a ping (`None`: never).
    missed_ping: Option<Instant>,
}

/// The silence allowed is this many times the member's usual answer time
/// (`srtt + 4 * rttvar`).
pub const SILENCE_FACTOR: u32 = 4;

impl Latency {
    /// The first answer, which took `sample`, came at `now`.
    pub fn new(sample: Duration, now: Instant) -> Latency {
        Latency {
            srtt: sample,
            rttvar: sample / 2,
            last_answer: now,
            missed_ping: None,
        }
    }

    /// Another answer, which took `sample`, came at `now`.
    pub fn record(&mut self, sample: Duration, now: Instant) {
        let diff = self.srtt.abs_diff(sample);
        self.rttvar = (self.rttvar * 3 + diff) / 4;
        self.srtt = (self.srtt * 7 + sample) / 8;
        self.last_answer = self.last_answer.max(now);
    }

    /// The usual answer time: the smoothed time plus four times its variation.
    pub fn usual(&self) -> Duration {
        self.srtt + self.rttvar * 4
    }

    /// When the member last answered.
    pub fn last_answer(&self) -> Instant {
        self.last_answer
    }

    /// How long the member may answer nothing before a request waiting on it is given up:
    /// [`SILENCE_FACTOR`] times its usual answer time, within `[floor, ceiling]`.
    pub fn silence_limit(&self, floor: Duration, ceiling: Duration) -> Duration {
        (self.usual() * SILENCE_FACTOR).clamp(floor, ceiling.max(floor))
    }

    /// How long a request to the member may go unanswered before it is hedged: its usual
    /// answer time (`srtt + 4 * rttvar`, which few answers exceed while the member is well),
    /// within `[floor, ceiling]`.
    pub fn hedge_delay(&self, floor: Duration, ceiling: Duration) -> Duration {
        self.usual().clamp(floor, ceiling.max(floor))
    }

    /// The member did not answer a ping sent before `at` in time.
    pub fn missed_ping(&mut self, at: Instant) {
        self.missed_ping = Some(self.missed_ping.map_or(at, |m| m.max(at)));
    }

    /// Whether the member missed a ping and has answered nothing since: it is probably gone
    /// (the silence rule has the last word: it waits longer before giving the member up).
    pub fn suspect(&self) -> bool {
        self.missed_ping.is_some_and(|m| m > self.last_answer)
    }

    /// When a request sent at `sent` is given up if nothing arrives from the member before:
    /// the silence limit after the later of the request and the member's last answer.
    pub fn give_up_at(&self, sent: Instant, floor: Duration, ceiling: Duration) -> Instant {
        sent.max(self.last_answer) + self.silence_limit(floor, ceiling)
    }
}

/// How many requests may be hedged: a token bucket filled by requests, not by time. Every
/// request adds `ratio` of a token (at most `burst` tokens are kept), every hedge takes one, so
/// over any long run at most `ratio` of the requests (plus `burst`) are hedged, while a member
/// that dies after a quiet spell finds a full bucket for the requests caught in flight.
/// Lock-free; a full bucket costs a request one atomic load.
#[derive(Debug)]
pub struct HedgeBudget {
    /// Tokens, in thousandths.
    milli: AtomicU64,
    /// Thousandths of a token one request adds.
    per_request: u64,
    /// Most thousandths kept.
    cap: u64,
}

impl HedgeBudget {
    /// A full bucket: `ratio` (0 to 1) of a token per request, at most `burst` tokens. A ratio
    /// of 0 or a burst of 0 never allows a hedge.
    pub fn new(ratio: f64, burst: u32) -> HedgeBudget {
        let per_request = (ratio.clamp(0.0, 1.0) * 1000.0).round() as u64;
        let cap = if per_request == 0 {
            0
        } else {
            u64::from(burst) * 1000
        };
        HedgeBudget {
            milli: AtomicU64::new(cap),
            per_request,
            cap,
        }
    }

    /// One request was sent.
    pub fn earn(&self) {
        if self.milli.load(Ordering::Relaxed) >= self.cap {
            return;
        }
        let (per, cap) = (self.per_request, self.cap);
        let _ = self
            .milli
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                (t < cap).then(|| (t + per).min(cap))
            });
    }

    /// Takes a token for a hedge; `false` when the bucket has less than one.
    pub fn spend(&self) -> bool {
        self.milli
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                t.checked_sub(1000)
            })
            .is_ok()
    }

    /// Whole tokens left.
    pub fn tokens(&self) -> u64 {
        self.milli.load(Ordering::Relaxed) / 1000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_steady_member_converges_to_its_latency() {
        let t0 = Instant::now();
        let mut l = Latency::new(10 * MS, t0);
        for i in 1..200 {
            l.record(2 * MS, t0 + i * MS);
        }
        assert!(l.usual() >= 2 * MS && l.usual() < 3 * MS, "{:?}", l.usual());
        assert_eq!(l.last_answer(), t0 + 199 * MS);
        // 4 x ~3 ms is under the floor: the floor holds.
        assert_eq!(l.silence_limit(100 * MS, 3000 * MS), 100 * MS);
    }

    #[test]
    fn jitter_widens_the_limit_and_the_ceiling_caps_it() {
        let t0 = Instant::now();
        let mut l = Latency::new(20 * MS, t0);
        for i in 0..100u32 {
            let sample = if i % 2 == 0 { 5 * MS } else { 60 * MS };
            l.record(sample, t0 + i * MS);
        }
        let limit = l.silence_limit(100 * MS, 3000 * MS);
        assert!(limit > 400 * MS, "variation must count: {limit:?}");
        assert_eq!(l.silence_limit(100 * MS, 400 * MS), 400 * MS);
        // A ceiling under the floor cannot invert the clamp.
        assert_eq!(l.silence_limit(100 * MS, 10 * MS), 100 * MS);
    }

    #[test]
    fn the_deadline_moves_with_every_answer_and_never_back() {
        let t0 = Instant::now();
        let mut l = Latency::new(5 * MS, t0);
        let (floor, ceil) = (100 * MS, 3000 * MS);
        let limit = l.silence_limit(floor, ceil);
        // A request sent before the last answer counts from the answer.
        assert_eq!(l.give_up_at(t0 - 50 * MS, floor, ceil), t0 + limit);
        // One sent later counts from its own sending.
        assert_eq!(
            l.give_up_at(t0 + 70 * MS, floor, ceil),
            t0 + 70 * MS + limit
        );
        l.record(5 * MS, t0 + 300 * MS);
        let limit = l.silence_limit(floor, ceil);
        assert_eq!(l.give_up_at(t0, floor, ceil), t0 + 300 * MS + limit);
        // An answer recorded out of order does not move the last answer back.
        l.record(5 * MS, t0 + 10 * MS);
        assert_eq!(l.last_answer(), t0 + 300 * MS);
    }

    #[test]
    fn the_hedge_delay_is_the_usual_answer_time_within_bounds() {
        let t0 = Instant::now();
        let mut l = Latency::new(30 * MS, t0);
        for i in 1..100 {
            l.record(30 * MS, t0 + i * MS);
        }
        // A steady 30 ms member: hedged a little after 30 ms, given up only after 4x that.
        let d = l.hedge_delay(10 * MS, 3000 * MS);
        assert!(d >= 30 * MS && d < 40 * MS, "{d:?}");
        assert!(l.silence_limit(10 * MS, 3000 * MS) >= 4 * d - 4 * MS);
        // Bounded below and above (the call timeout).
        assert_eq!(l.hedge_delay(50 * MS, 3000 * MS), 50 * MS);
        assert_eq!(l.hedge_delay(10 * MS, 20 * MS), 20 * MS);
        assert_eq!(l.hedge_delay(10 * MS, 5 * MS), 10 * MS);
        // A member that slows down is hedged later: the delay follows the answers.
        for i in 100..200 {
            l.record(120 * MS, t0 + i * MS);
        }
        assert!(l.hedge_delay(10 * MS, 3000 * MS) >= 120 * MS);
    }

    #[test]
    fn a_missed_ping_makes_a_member_suspect_until_it_answers() {
        let t0 = Instant::now();
        let mut l = Latency::new(5 * MS, t0);
        assert!(!l.suspect());
        l.missed_ping(t0 + 100 * MS);
        assert!(l.suspect());
        // An earlier miss reported late does not move it back.
        l.missed_ping(t0 + 50 * MS);
        assert!(l.suspect());
        l.record(5 * MS, t0 + 200 * MS);
        assert!(!l.suspect(), "an answer after the miss clears it");
        // An answer that was sent before the miss does not.
        l.missed_ping(t0 + 300 * MS);
        l.record(5 * MS, t0 + 250 * MS);
        assert!(l.suspect());
    }

    #[test]
    fn the_budget_allows_a_burst_then_its_ratio_of_requests() {
        let b = HedgeBudget::new(0.05, 4);
        // Full at the start: a burst of 4.
        assert!((0..4).all(|_| b.spend()));
        assert!(!b.spend());
        // Then one hedge per 20 requests.
        let mut allowed = 0;
        for _ in 0..1000 {
            b.earn();
            if b.spend() {
                allowed += 1;
            }
        }
        assert_eq!(allowed, 50);
        // Quiet requests refill it, but never beyond the burst.
        for _ in 0..10_000 {
            b.earn();
        }
        assert_eq!(b.tokens(), 4);
        assert_eq!((0..10).filter(|_| b.spend()).count(), 4);
    }

    #[test]
    fn a_zero_budget_never_hedges() {
        for b in [HedgeBudget::new(0.0, 10), HedgeBudget::new(0.05, 0)] {
            for _ in 0..1000 {
                b.earn();
            }
            assert!(!b.spend());
        }
        // A ratio above 1 is 1: one hedge per request at most.
        let b = HedgeBudget::new(7.0, 1);
        assert!(b.spend());
        b.earn();
        assert!(b.spend());
        assert!(!b.spend());
    }
}
