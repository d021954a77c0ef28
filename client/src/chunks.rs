//! A reply's payload as it arrived: the chunks quinn hands over (each a view of the datagram it
//! came in), in order and never copied. A reader copies them once, into its own buffer
//! ([`Chunks::copy_to_slice`]); code that needs one contiguous buffer asks for it
//! ([`crate::pool::Pool::join`], [`Chunks::to_bytes`]) and pays that copy there.

use bytes::Bytes;

/// Bytes in pieces, in order. Cloning copies no payload bytes.
#[derive(Clone, Debug, Default)]
pub struct Chunks {
    parts: Vec<Bytes>,
    len: usize,
}

impl Chunks {
    /// No bytes.
    pub fn new() -> Chunks {
        Chunks::default()
    }

    /// Appends `b` (an empty one is skipped).
    pub fn push(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.len += b.len();
            self.parts.push(b);
        }
    }

    /// Appends every piece of `other`.
    pub fn append(&mut self, other: Chunks) {
        self.len += other.len;
        self.parts.extend(other.parts);
    }

    /// Bytes in all.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pieces, in order (none empty).
    pub fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    /// The bytes of `range` as slices of the pieces, in order. Panics if the range is not
    /// within [`Chunks::len`] (callers take the length from it).
    pub fn pieces(&self, range: std::ops::Range<usize>) -> impl Iterator<Item = &[u8]> + '_ {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "range past the end of the chunks"
        );
        let mut at = 0;
        self.parts.iter().filter_map(move |p| {
            let (s, e) = (at, at + p.len());
            at = e;
            (e > range.start && s < range.end)
                .then(|| &p[range.start.max(s) - s..range.end.min(e) - s])
        })
    }

    /// Copies the bytes from offset `from` into `out`, filling it. Panics if fewer than
    /// `out.len()` bytes follow `from`.
    pub fn copy_to_slice(&self, from: usize, out: &mut [u8]) {
        let mut at = 0;
        for piece in self.pieces(from..from + out.len()) {
            out[at..at + piece.len()].copy_from_slice(piece);
            at += piece.len();
        }
    }

    /// The bytes in one buffer: the piece itself where there is only one, else one copy.
    pub fn to_bytes(&self) -> Bytes {
        match self.parts.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            parts => {
                let mut v = Vec::with_capacity(self.len);
                for p in parts {
                    v.extend_from_slice(p);
                }
                v.into()
            }
        }
    }
}

impl From<Bytes> for Chunks {
    fn from(b: Bytes) -> Chunks {
        let mut c = Chunks::new();
        c.push(b);
        c
    }
}

impl PartialEq for Chunks {
    /// The same bytes, however they are cut.
    fn eq(&self, other: &Chunks) -> bool {
        self.len == other.len
            && self
                .parts
                .iter()
                .flat_map(|p| p.iter())
                .eq(other.parts.iter().flat_map(|p| p.iter()))
    }
}

impl Eq for Chunks {}

#[cfg(test)]
mod tests {
    use super::*;

    /// `data` cut at `cuts` (offsets, ascending).
    fn cut(data: &[u8], cuts: &[usize]) -> Chunks {
        let mut c = Chunks::new();
        let mut from = 0;
        for &at in cuts.iter().chain(std::iter::once(&data.len())) {
            c.push(Bytes::copy_from_slice(&data[from..at]));
            from = at;
        }
        c
    }

    #[test]
    fn copies_and_pieces_give_the_bytes_at_every_offset_whatever_the_cuts() {
        let data: Vec<u8> = (0..200u32).map(|i| (i * 7 % 251) as u8).collect();
        for cuts in [
            vec![],
            vec![0],
            vec![1],
            vec![100],
            vec![3, 3, 50, 199],
            vec![10, 20, 30, 40, 150],
        ] {
            let c = cut(&data, &cuts);
            assert_eq!(c.len(), data.len());
            assert!(c.parts().iter().all(|p| !p.is_empty()), "{cuts:?}");
            assert_eq!(&c.to_bytes()[..], &data[..], "{cuts:?}");
            for from in [0, 1, 2, 9, 10, 11, 99, 100, 101, 150, 199, 200] {
                for len in [0, 1, 5, 50, 200] {
                    let end = (from + len).min(data.len());
                    let mut out = vec![0u8; end - from];
                    c.copy_to_slice(from, &mut out);
                    assert_eq!(&out[..], &data[from..end], "{cuts:?} {from} {len}");
                    let joined: Vec<u8> = c.pieces(from..end).flatten().copied().collect();
                    assert_eq!(&joined[..], &data[from..end], "{cuts:?} {from}..{end}");
                }
            }
            // Equal to the same bytes cut elsewhere, not to other bytes.
            assert_eq!(c, cut(&data, &[77]));
            let mut other = data.clone();
            other[150] ^= 1;
            assert_ne!(c, cut(&other, &cuts));
        }
    }

    #[test]
    fn one_piece_is_handed_over_without_a_copy() {
        let b = Bytes::from(vec![1u8; 64]);
        let c = Chunks::from(b.clone());
        assert_eq!(c.to_bytes().as_ptr(), b.as_ptr());
        assert!(Chunks::from(Bytes::new()).parts().is_empty());
        let mut two = c.clone();
        two.append(Chunks::from(Bytes::from_static(b"xy")));
        assert_eq!(two.len(), 66);
        assert_eq!(two.parts().len(), 2);
    }

    #[test]
    #[should_panic(expected = "range past the end")]
    fn a_copy_past_the_end_is_refused() {
        let c = Chunks::from(Bytes::from_static(b"abc"));
        c.copy_to_slice(2, &mut [0u8; 2]);
    }
}
