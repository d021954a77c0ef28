//! Deterministic test data: the one generator behind the bytes that tests and the benchmark
//! harness write and later check (page contents, file contents, objects).
//!
//! Everything here is xorshift64 (Marsaglia, shifts 13, 7, 17) written out as little-endian 64-bit
//! words: the same seed always gives the same bytes, a shorter length gives a prefix of a longer
//! one, and filling a buffer in pieces gives the same stream as filling it at once (as long as
//! every piece but the last is a multiple of 8 bytes long).

/// The golden-ratio constant `2^64 / φ`, for spreading small seeds over 64 bits.
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// A xorshift64 generator. Not for cryptography; for reproducible inputs.
#[derive(Clone, Debug)]
pub struct Xorshift(u64);

impl Xorshift {
    /// A generator whose first output is the step after `state`. Xorshift never leaves 0, so a
    /// zero state is replaced by [`GOLDEN`]; every other state is used as it is.
    pub fn new(state: u64) -> Xorshift {
        Xorshift(if state == 0 { GOLDEN } else { state })
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A value below `n` (`n > 0`; slightly biased, which tests do not mind).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Fills `buf` with the next values as little-endian words; a last piece shorter than 8 bytes
    /// takes the low bytes of one more value.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let w = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&w[..chunk.len()]);
        }
    }
}

/// `len` pseudo-random bytes from `seed` (any value, 0 included; small seeds are spread with
/// [`GOLDEN`] first, so neighbouring seeds give unrelated bytes from the first word on).
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    Xorshift::new(seed.wrapping_mul(GOLDEN) | 1).fill(&mut v);
    v
}

/// The contents of a page: the same `(file, page, version, len)` always gives the same bytes, and
/// any change of file, page or version gives different ones, so a reader can check every page it
/// gets back.
pub fn page_bytes(file: u128, page: u64, version: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    Xorshift::new(page_seed(file, page, version)).fill(&mut v);
    v
}

/// The seed [`page_bytes`] uses.
pub fn page_seed(file: u128, page: u64, version: u64) -> u64 {
    (file as u64) ^ ((file >> 64) as u64) ^ page.rotate_left(17) ^ version.rotate_left(41) ^ GOLDEN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_is_fixed() {
        // Golden values: datasets the benchmark harness keeps between runs depend on them.
        let mut x = Xorshift::new(1);
        assert_eq!(x.next_u64(), 0x0000_0000_4082_2041);
        assert_eq!(x.next_u64(), 0x1000_4106_0C01_1441);
        assert_eq!(
            Xorshift::new(0).next_u64(),
            Xorshift::new(GOLDEN).next_u64()
        );
        let mut g = Xorshift::new(GOLDEN);
        let (w0, w1) = (g.next_u64(), g.next_u64());
        let b = bytes(1, 10);
        assert_eq!(&b[..8], &w0.to_le_bytes());
        assert_eq!(&b[8..], &w1.to_le_bytes()[..2]);
    }

    #[test]
    fn prefixes_and_pieces_agree() {
        let long = bytes(42, 1000);
        assert_eq!(bytes(42, 13), long[..13]);
        let mut pieces = vec![0; 1000];
        let mut g = Xorshift::new(42u64.wrapping_mul(GOLDEN) | 1);
        let (a, b) = pieces.split_at_mut(512);
        g.fill(a);
        g.fill(b);
        assert_eq!(pieces, long);
    }

    #[test]
    fn pages_differ_by_file_page_and_version() {
        let base = page_bytes(1, 0, 1, 64);
        assert_eq!(page_bytes(1, 0, 1, 64), base);
        for other in [
            page_bytes(2, 0, 1, 64),
            page_bytes(1, 1, 1, 64),
            page_bytes(1, 0, 2, 64),
        ] {
            assert_ne!(other, base);
        }
    }
}
