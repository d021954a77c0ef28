//! How long the client waits for a member: an estimate of each member's usual answer time, and
//! from it the silence after which a member that answers nothing at all is given up on.
//!
//! A fixed call timeout makes every reader with a request on a dead node wait it out (3 s by
//! default). Instead, a request is abandoned when its member has been silent (answered no
//! request of this client) for a multiple of its usual latency: a killed node is left within a
//! fraction of a second, while a node that is merely busy keeps answering other requests and
//! keeps its readers. Pure state, no clock of its own and no I/O: the caller passes the times.

use std::time::{Duration, Instant};

/// Smoothed answer time and its variation (as TCP's retransmission timer keeps them, RFC 6298:
/// gains 1/8 and 1/4), and when the member last answered.
#[derive(Clone, Copy, Debug)]
pub struct Latency {
    srtt: Duration,
    rttvar: Duration,
    last_answer: Instant,
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

    /// When a request sent at `sent` is given up if nothing arrives from the member before:
    /// the silence limit after the later of the request and the member's last answer.
    pub fn give_up_at(&self, sent: Instant, floor: Duration, ceiling: Duration) -> Instant {
        sent.max(self.last_answer) + self.silence_limit(floor, ceiling)
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
}
