//! Page identity.

use std::fmt;

/// The identity of one cached page: a 128-bit file id and the page's index in that file.
///
/// The file id is chosen by the layer above (the client derives it from the mount, the object
/// path and the object's version tag), so a changed object gets new keys and never hits stale
/// pages. The engine treats it as opaque.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageKey {
    /// Opaque 128-bit file identifier.
    pub file_id: u128,
    /// Zero-based page number inside the file (byte offset / page size).
    pub page_index: u64,
}

impl PageKey {
    /// Builds a key.
    pub fn new(file_id: u128, page_index: u64) -> Self {
        Self {
            file_id,
            page_index,
        }
    }

    /// A stable 64-bit mix of the key (splitmix-style finaliser). Used by eviction ghosts and
    /// by [`crate::Engine::shard_of`]; it never changes between releases.
    pub fn hash64(&self) -> u64 {
        let mut h = (self.file_id as u64)
            ^ ((self.file_id >> 64) as u64).rotate_left(29)
            ^ self.page_index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^= h >> 33;
        h
    }
}

impl fmt::Display for PageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}/{}", self.file_id, self.page_index)
    }
}
