//! The on-disk format of one shard cache file. docs/FORMAT.md describes the same layout in prose;
//! keep the two in step.
//!
//! ```text
//! [0, 4096)                      superblock
//! [SLOT_TABLE_OFF, crc_off)      slot headers, 64 bytes per slot, padded to 4096
//! [crc_off, meta_end)            per-slot chunk checksum tables, padded to 4096
//! [data_off, file_size)          page data, `page_size` bytes per slot; data_off is 1 MiB aligned
//! ```
//! All integers are little-endian.

use crate::key::PageKey;

/// Alignment and size of every metadata write and of every data I/O boundary.
pub const BLOCK: u64 = 4096;
/// Size of one slot header.
pub const HEADER_SIZE: usize = 64;
/// Superblock magic.
pub const SUPER_MAGIC: [u8; 8] = *b"PAGESTOR";
/// Slot header magic ("PGHD" as bytes).
pub const HEADER_MAGIC: u32 = u32::from_le_bytes(*b"PGHD");
/// Version of this layout; bumped on any incompatible change.
pub const FORMAT_VERSION: u32 = 1;
/// Offset of the slot table.
pub const SLOT_TABLE_OFF: u64 = BLOCK;
/// Data region alignment.
pub const DATA_ALIGN: u64 = 1 << 20;
/// Header flag: the page is pinned.
pub const FLAG_PINNED: u8 = 1;

/// Header flag: the page is dirty (written through the cluster, not in the under storage yet):
/// never evicted.
pub const FLAG_DIRTY: u8 = 2;

/// Rounds `v` up to a multiple of `a` (a power of two).
pub fn align_up(v: u64, a: u64) -> u64 {
    (v + a - 1) & !(a - 1)
}

/// Where everything lives in one cache file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Page size in bytes (power of two).
    pub page_size: u32,
    /// Checksum granule in bytes (power of two, 4096..=page_size).
    pub chunk_size: u32,
    /// Number of page slots.
    pub nslots: u32,
    /// Offset of the checksum tables.
    pub crc_off: u64,
    /// End of the metadata (everything that is mirrored in memory).
    pub meta_end: u64,
    /// Offset of slot 0's data.
    pub data_off: u64,
    /// Total file size.
    pub file_size: u64,
}

impl Geometry {
    /// Lays out a file with `nslots` slots.
    pub fn new(page_size: u32, chunk_size: u32, nslots: u32) -> Self {
        let table = Self::table_bytes_for(page_size, chunk_size);
        let crc_off = SLOT_TABLE_OFF + align_up(nslots as u64 * HEADER_SIZE as u64, BLOCK);
        let meta_end = crc_off + align_up(nslots as u64 * table, BLOCK);
        let data_off = align_up(meta_end, DATA_ALIGN);
        let file_size = data_off + nslots as u64 * page_size as u64;
        Geometry {
            page_size,
            chunk_size,
            nslots,
            crc_off,
            meta_end,
            data_off,
            file_size,
        }
    }

    /// The largest layout whose file fits in `capacity` bytes; `None` if not even one slot fits.
    pub fn for_capacity(page_size: u32, chunk_size: u32, capacity: u64) -> Option<Self> {
        let per_slot =
            page_size as u64 + HEADER_SIZE as u64 + Self::table_bytes_for(page_size, chunk_size);
        let mut n = (capacity / per_slot).min(u32::MAX as u64 - 1) as u32;
        loop {
            if n == 0 {
                return None;
            }
            let g = Self::new(page_size, chunk_size, n);
            if g.file_size <= capacity {
                return Some(g);
            }
            // At most a few steps: the fixed overhead is under 2 MiB.
            let over = g.file_size - capacity;
            n = n.saturating_sub(over.div_ceil(per_slot).max(1) as u32);
        }
    }

    fn table_bytes_for(page_size: u32, chunk_size: u32) -> u64 {
        (page_size / chunk_size) as u64 * 4
    }

    /// Checksum entries per full page.
    pub fn chunks_per_page(&self) -> u32 {
        self.page_size / self.chunk_size
    }

    /// Bytes of one slot's checksum table.
    pub fn table_bytes(&self) -> u64 {
        Self::table_bytes_for(self.page_size, self.chunk_size)
    }

    /// Offset of a slot's header.
    pub fn header_off(&self, slot: u32) -> u64 {
        SLOT_TABLE_OFF + slot as u64 * HEADER_SIZE as u64
    }

    /// Offset of a slot's checksum table.
    pub fn table_off(&self, slot: u32) -> u64 {
        self.crc_off + slot as u64 * self.table_bytes()
    }

    /// Offset of a slot's data.
    pub fn data_off(&self, slot: u32) -> u64 {
        self.data_off + slot as u64 * self.page_size as u64
    }

    /// Number of checksum chunks covering `len` bytes.
    pub fn chunks_for(&self, len: u32) -> u32 {
        len.div_ceil(self.chunk_size)
    }
}

/// Identity of a cache file inside an engine: which shard and directory it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileIdent {
    /// Shard index.
    pub shard: u32,
    /// Number of shards.
    pub shards: u32,
    /// Index of the cache directory.
    pub dir: u32,
    /// Number of cache directories.
    pub dirs: u32,
}

/// The decoded superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// Layout.
    pub geometry: Geometry,
    /// Owner.
    pub ident: FileIdent,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// Random id of this cache file instance.
    pub instance: u128,
    /// Fingerprint of the rule prefixes the pages' rule numbers refer to
    /// ([`crate::rules::Rules::fingerprint`]; 0: no rules).
    pub rules: u64,
}

/// Why a superblock could not be used.
#[derive(Debug, PartialEq, Eq)]
pub enum SuperError {
    /// All zero: the file was created but never formatted.
    Blank,
    /// A valid superblock of another format version (written by another release).
    Version(u32),
    /// Something is there but it is not a valid superblock.
    Invalid(String),
}

fn get_u32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

fn get_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

fn get_u128(b: &[u8], off: usize) -> u128 {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[off..off + 16]);
    u128::from_le_bytes(a)
}

impl Superblock {
    /// Writes the superblock into a 4096-byte block.
    pub fn encode(&self, b: &mut [u8]) {
        let b = &mut b[..BLOCK as usize];
        b.fill(0);
        let g = &self.geometry;
        b[0..8].copy_from_slice(&SUPER_MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_SIZE as u32).to_le_bytes());
        b[16..20].copy_from_slice(&g.page_size.to_le_bytes());
        b[20..24].copy_from_slice(&g.chunk_size.to_le_bytes());
        b[24..28].copy_from_slice(&g.nslots.to_le_bytes());
        b[28..32].copy_from_slice(&self.ident.shard.to_le_bytes());
        b[32..36].copy_from_slice(&self.ident.shards.to_le_bytes());
        b[36..40].copy_from_slice(&self.ident.dir.to_le_bytes());
        b[40..44].copy_from_slice(&self.ident.dirs.to_le_bytes());
        b[48..56].copy_from_slice(&SLOT_TABLE_OFF.to_le_bytes());
        b[56..64].copy_from_slice(&g.crc_off.to_le_bytes());
        b[64..72].copy_from_slice(&g.data_off.to_le_bytes());
        b[72..80].copy_from_slice(&g.file_size.to_le_bytes());
        b[80..88].copy_from_slice(&self.created_ms.to_le_bytes());
        b[88..104].copy_from_slice(&self.instance.to_le_bytes());
        b[104..112].copy_from_slice(&self.rules.to_le_bytes());
        let crc = crc32fast::hash(&b[..4092]);
        b[4092..4096].copy_from_slice(&crc.to_le_bytes());
    }

    /// Parses and validates a superblock.
    pub fn decode(b: &[u8]) -> Result<Self, SuperError> {
        if b.len() < BLOCK as usize {
            return Err(SuperError::Invalid("file shorter than one block".into()));
        }
        let b = &b[..BLOCK as usize];
        if b.iter().all(|&x| x == 0) {
            return Err(SuperError::Blank);
        }
        if b[0..8] != SUPER_MAGIC {
            return Err(SuperError::Invalid(
                "not a pagestore cache file (bad magic)".into(),
            ));
        }
        if crc32fast::hash(&b[..4092]) != get_u32(b, 4092) {
            return Err(SuperError::Invalid("superblock checksum mismatch".into()));
        }
        let version = get_u32(b, 8);
        if version != FORMAT_VERSION {
            return Err(SuperError::Version(version));
        }
        if get_u32(b, 12) != HEADER_SIZE as u32 || get_u64(b, 48) != SLOT_TABLE_OFF {
            return Err(SuperError::Invalid(
                "unexpected header size or slot table offset".into(),
            ));
        }
        let page_size = get_u32(b, 16);
        let chunk_size = get_u32(b, 20);
        let nslots = get_u32(b, 24);
        if !page_size.is_power_of_two()
            || !chunk_size.is_power_of_two()
            || chunk_size < BLOCK as u32
            || chunk_size > page_size
            || nslots == 0
        {
            return Err(SuperError::Invalid("impossible geometry".into()));
        }
        let geometry = Geometry::new(page_size, chunk_size, nslots);
        if geometry.crc_off != get_u64(b, 56)
            || geometry.data_off != get_u64(b, 64)
            || geometry.file_size != get_u64(b, 72)
        {
            return Err(SuperError::Invalid(
                "region offsets disagree with geometry".into(),
            ));
        }
        Ok(Superblock {
            geometry,
            ident: FileIdent {
                shard: get_u32(b, 28),
                shards: get_u32(b, 32),
                dir: get_u32(b, 36),
                dirs: get_u32(b, 40),
            },
            created_ms: get_u64(b, 80),
            instance: get_u128(b, 88),
            rules: get_u64(b, 104),
        })
    }
}

/// One decoded slot header: the page's identity and checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotHeader {
    /// Which page.
    pub key: PageKey,
    /// Bytes of data (at most the page size).
    pub len: u32,
    /// crc32 of the page's checksum table (the little-endian chunk checksums, `chunks_for(len)`
    /// entries): a checksum over the data by way of the chunk checksums.
    pub data_crc: u32,
    /// The under-storage version tag of the object the page came from.
    pub version: u64,
    /// Insert time, milliseconds since the Unix epoch.
    pub inserted_ms: u64,
    /// Flags (`FLAG_PINNED`, `FLAG_DIRTY`).
    pub flags: u8,
    /// The page's rule number (0: no rule; see [`crate::rules`]).
    pub rule: u8,
}

/// What a 64-byte header slot holds.
#[derive(Debug, PartialEq, Eq)]
pub enum HeaderState {
    /// All zero: the slot is free.
    Empty,
    /// A valid header for this slot.
    Valid(SlotHeader),
    /// Anything else (torn write, bit rot, another slot's header): treated as free and cleared.
    Invalid,
}

impl SlotHeader {
    /// Encodes into 64 bytes for slot number `slot`.
    pub fn encode(&self, slot: u32, b: &mut [u8]) {
        let b = &mut b[..HEADER_SIZE];
        b[0..4].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&(FORMAT_VERSION as u16).to_le_bytes());
        b[6] = self.flags;
        b[7] = self.rule;
        b[8..24].copy_from_slice(&self.key.file_id.to_le_bytes());
        b[24..32].copy_from_slice(&self.key.page_index.to_le_bytes());
        b[32..36].copy_from_slice(&self.len.to_le_bytes());
        b[36..40].copy_from_slice(&self.data_crc.to_le_bytes());
        b[40..48].copy_from_slice(&self.version.to_le_bytes());
        b[48..56].copy_from_slice(&self.inserted_ms.to_le_bytes());
        b[56..60].copy_from_slice(&slot.to_le_bytes());
        let crc = crc32fast::hash(&b[0..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes the 64 bytes of slot number `slot`, for a cache with `page_size`.
    pub fn decode(slot: u32, page_size: u32, b: &[u8]) -> HeaderState {
        let b = &b[..HEADER_SIZE];
        if b.iter().all(|&x| x == 0) {
            return HeaderState::Empty;
        }
        if get_u32(b, 0) != HEADER_MAGIC
            || crc32fast::hash(&b[0..60]) != get_u32(b, 60)
            || u16::from_le_bytes([b[4], b[5]]) != FORMAT_VERSION as u16
            || get_u32(b, 56) != slot
        {
            return HeaderState::Invalid;
        }
        let len = get_u32(b, 32);
        if len > page_size {
            return HeaderState::Invalid;
        }
        HeaderState::Valid(SlotHeader {
            key: PageKey::new(get_u128(b, 8), get_u64(b, 24)),
            len,
            data_crc: get_u32(b, 36),
            version: get_u64(b, 40),
            inserted_ms: get_u64(b, 48),
            flags: b[6],
            rule: b[7],
        })
    }
}

/// Clears a header (the on-disk tombstone is all zeroes).
pub fn clear_header(b: &mut [u8]) {
    b[..HEADER_SIZE].fill(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_fits_capacity_and_is_aligned() {
        for &page in &[64u32 << 10, 1 << 20, 4 << 20, 64 << 20] {
            for &cap in &[page as u64 * 3 + (2 << 20), 1u64 << 30, 10u64 << 30] {
                let g = Geometry::for_capacity(page, 4096, cap).expect("fits");
                assert!(g.file_size <= cap);
                // One more slot would not fit.
                assert!(Geometry::new(page, 4096, g.nslots + 1).file_size > cap);
                assert_eq!(g.data_off % DATA_ALIGN, 0);
                assert_eq!(g.crc_off % BLOCK, 0);
                assert!(g.meta_end <= g.data_off);
                assert!(g.table_off(g.nslots - 1) + g.table_bytes() <= g.meta_end);
            }
        }
        assert_eq!(Geometry::for_capacity(4 << 20, 4096, 1 << 20), None);
    }

    #[test]
    fn superblock_round_trip_and_damage() {
        let sb = Superblock {
            geometry: Geometry::new(4 << 20, 4096, 100),
            ident: FileIdent {
                shard: 1,
                shards: 2,
                dir: 0,
                dirs: 1,
            },
            created_ms: 123,
            instance: 0xdead_beef,
            rules: 0x1234_5678_9abc_def0,
        };
        let mut b = vec![0u8; 4096];
        assert_eq!(Superblock::decode(&b), Err(SuperError::Blank));
        sb.encode(&mut b);
        assert_eq!(Superblock::decode(&b), Ok(sb));
        for i in [0usize, 17, 30, 100, 105, 4093] {
            let mut c = b.clone();
            c[i] ^= 0x40;
            assert!(matches!(
                Superblock::decode(&c),
                Err(SuperError::Invalid(_))
            ));
        }
    }

    #[test]
    fn header_round_trip_and_damage() {
        let h = SlotHeader {
            key: PageKey::new(u128::MAX - 5, 77),
            len: 4096 * 3 + 5,
            data_crc: 0x1234_5678,
            version: 42,
            inserted_ms: 1_700_000_000_000,
            flags: FLAG_PINNED,
            rule: 7,
        };
        let mut b = [0u8; HEADER_SIZE];
        assert_eq!(SlotHeader::decode(3, 4 << 20, &b), HeaderState::Empty);
        h.encode(3, &mut b);
        assert_eq!(SlotHeader::decode(3, 4 << 20, &b), HeaderState::Valid(h));
        // A header copied to another slot is not valid there.
        assert_eq!(SlotHeader::decode(4, 4 << 20, &b), HeaderState::Invalid);
        // A length larger than the page size is invalid.
        assert_eq!(SlotHeader::decode(3, 4096, &b), HeaderState::Invalid);
        for i in 0..HEADER_SIZE {
            let mut c = b;
            c[i] ^= 1;
            assert_eq!(
                SlotHeader::decode(3, 4 << 20, &c),
                HeaderState::Invalid,
                "byte {i}"
            );
        }
        clear_header(&mut b);
        assert_eq!(SlotHeader::decode(3, 4 << 20, &b), HeaderState::Empty);
    }
}
