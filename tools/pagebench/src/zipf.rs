//! A Zipf-distributed sampler over `n` items, deterministic for a seed.
//!
//! Item of rank `k` (0-based) is drawn with probability `(k + 1)^-s / H(n, s)`. Sampling is an
//! inversion of the cumulative distribution (a table of `n` f64s, a binary search per draw).
//! Ranks are then spread over the item space by a seeded affine permutation, so the hot items
//! are not simply the first pages of the first file.

use anyhow::{bail, Result};

/// The largest item count the table accepts (8 bytes per item).
pub const MAX_ITEMS: u64 = 1 << 26;

/// The sampler.
#[derive(Clone, Debug)]
pub struct Zipf {
    cdf: Vec<f64>,
    n: u64,
    mul: u64,
    add: u64,
}

/// A uniform draw in [0, 1) from the harness's xorshift state.
pub fn unit(x: &mut u64) -> f64 {
    (crate::local::rng_next(x) >> 11) as f64 / (1u64 << 53) as f64
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Zipf {
    /// A sampler over `n` items with skew `s` (0 is uniform; about 1 is the classic Zipf; larger
    /// is more skewed), with the rank-to-item permutation chosen by `seed`.
    pub fn new(n: u64, s: f64, seed: u64) -> Result<Zipf> {
        if n == 0 {
            bail!("zipf: no items to choose from");
        }
        if n > MAX_ITEMS {
            bail!(
                "zipf: {n} items is more than the sampler's table allows ({MAX_ITEMS}); use \
                 larger pages or fewer files"
            );
        }
        if !s.is_finite() || s < 0.0 {
            bail!("--zipf {s}: the skew must be a number >= 0");
        }
        let mut cdf = Vec::with_capacity(n as usize);
        let mut sum = 0.0f64;
        for k in 0..n {
            sum += ((k + 1) as f64).powf(-s);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        // An affine permutation r -> (mul * r + add) mod n, with mul coprime to n.
        let mut x = (seed ^ 0x5DEE_CE66_D1CE_4E5B) | 1;
        crate::local::rng_next(&mut x);
        let mut mul = (crate::local::rng_next(&mut x) % n).max(1);
        while gcd(mul, n) != 1 {
            mul = mul % n + 1;
        }
        let add = crate::local::rng_next(&mut x) % n;
        Ok(Zipf { cdf, n, mul, add })
    }

    /// The rank (0 = hottest) of a uniform draw.
    pub fn rank(&self, x: &mut u64) -> u64 {
        let u = unit(x);
        (self.cdf.partition_point(|&c| c <= u) as u64).min(self.n - 1)
    }

    /// The item of rank `r`.
    pub fn item(&self, r: u64) -> u64 {
        ((u128::from(self.mul) * u128::from(r) + u128::from(self.add)) % u128::from(self.n)) as u64
    }

    /// One draw: an item in `0..n`.
    pub fn sample(&self, x: &mut u64) -> u64 {
        self.item(self.rank(x))
    }

    /// The probability of the item of rank `r`.
    #[cfg(test)]
    pub fn probability(&self, r: u64) -> f64 {
        let r = r as usize;
        self.cdf[r] - if r == 0 { 0.0 } else { self.cdf[r - 1] }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frequencies_follow_the_law() {
        let z = Zipf::new(1000, 1.1, 7).unwrap();
        let mut counts = vec![0u64; 1000];
        let mut x = 12345u64;
        let draws = 400_000;
        for _ in 0..draws {
            counts[z.rank(&mut x) as usize] += 1;
        }
        for r in [0u64, 1, 2, 9, 99] {
            let want = z.probability(r) * draws as f64;
            let got = counts[r as usize] as f64;
            let tol = 5.0 * want.sqrt() + 5.0;
            assert!(
                (got - want).abs() < tol,
                "rank {r}: {got} draws, {want:.0} expected"
            );
        }
        // Rank 0 is (1/1)/(1/2)^1.1 = 2.14x rank 1.
        let ratio = counts[0] as f64 / counts[1] as f64;
        assert!((ratio - 2f64.powf(1.1)).abs() < 0.1, "{ratio}");
    }

    #[test]
    fn zero_skew_is_uniform_and_every_item_is_reachable() {
        let z = Zipf::new(10, 0.0, 3).unwrap();
        let mut counts = [0u64; 10];
        let mut x = 99u64;
        for _ in 0..100_000 {
            counts[z.sample(&mut x) as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn the_permutation_is_a_bijection_and_seeded() {
        for n in [1u64, 2, 6, 97, 1024, 1000] {
            let z = Zipf::new(n, 1.0, n * 31).unwrap();
            let mut seen: Vec<u64> = (0..n).map(|r| z.item(r)).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n = {n}");
        }
        let draw = |seed| {
            let z = Zipf::new(500, 0.9, seed).unwrap();
            let mut x = 5u64;
            (0..50).map(|_| z.sample(&mut x)).collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }

    #[test]
    fn bad_parameters_are_refused() {
        assert!(Zipf::new(0, 1.0, 1).is_err());
        assert!(Zipf::new(10, -1.0, 1).is_err());
        assert!(Zipf::new(10, f64::NAN, 1).is_err());
        assert!(Zipf::new(MAX_ITEMS + 1, 1.0, 1).is_err());
    }
}
