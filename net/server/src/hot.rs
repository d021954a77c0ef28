//! What a shard knows about its hot spots and its egress: its hottest files and pages
//! (space-saving counters in small fixed tables) and its bytes per mount (served from the cache,
//! read from the store). Updated on every `Fetch` on the shard's own thread; answered as a
//! [`HotReport`] (`Hot` request).
//!
//! Space-saving (Metwally, Agrawal and El Abbadi, 2005): a table of `k` counters; a key in the
//! table adds its weight; a new key takes the place of the entry with the smallest count and
//! starts from that count (remembered as its error), so every key whose true weight exceeds
//! `total / k` is in the table, and no count is low. The tables are searched linearly (64
//! entries, a few dozen nanoseconds) and never grow; a file's path is copied into the buffer of
//! the entry it replaces, which allocates only when that buffer is too short.

use std::time::{Duration, Instant};

use crate::frame::{
    FileId, HotFile, HotPage, HotReport, Key, MountBytes, MountEntry, MAX_HOT_FILES, MAX_HOT_PAGES,
    MAX_MOUNTS, MAX_MOUNT_TABLE_BYTES,
};
use crate::source::egress_price;

/// Files tracked per shard (the report names the hottest [`MAX_HOT_FILES`]).
pub const FILES_TRACKED: usize = 64;
/// Pages tracked per shard (the report names the hottest [`MAX_HOT_PAGES`]).
pub const PAGES_TRACKED: usize = 64;
/// Path bytes reserved per file entry up front.
const PATH_RESERVE: usize = 256;
/// How often the per-mount table is compared with the mount table in force.
const MOUNTS_REFRESH: Duration = Duration::from_secs(1);

struct FileSlot {
    file_id: u128,
    path: String,
    bytes: u64,
    error: u64,
    reads: u64,
}

#[derive(Clone, Copy)]
struct PageSlot {
    file_id: u128,
    page: u64,
    reads: u64,
    error: u64,
}

struct MountSlot {
    prefix: String,
    usd_per_tb: f64,
    cache_bytes: u64,
    store_bytes: u64,
}

/// One shard's hot-spot and egress counters.
pub struct HotTracker {
    files: Vec<FileSlot>,
    pages: Vec<PageSlot>,
    /// Longest prefix first.
    mounts: Vec<MountSlot>,
    mounts_checked: Option<Instant>,
}

impl Default for HotTracker {
    fn default() -> Self {
        HotTracker::new()
    }
}

/// Index of the entry with the smallest count (the table is not empty).
fn argmin(counts: impl Iterator<Item = u64>) -> usize {
    let mut best = (0, u64::MAX);
    for (i, c) in counts.enumerate() {
        if c < best.1 {
            best = (i, c);
        }
    }
    best.0
}

impl HotTracker {
    /// Empty tables, their room reserved.
    pub fn new() -> HotTracker {
        HotTracker {
            files: Vec::with_capacity(FILES_TRACKED),
            pages: Vec::with_capacity(PAGES_TRACKED),
            mounts: Vec::new(),
            mounts_checked: None,
        }
    }

    /// One read of `bytes` bytes of page `page` of the file `file_id` at `path`.
    pub fn record_read(&mut self, file_id: u128, path: &str, page: u64, bytes: u64) {
        self.record_file(file_id, path, bytes);
        self.record_page(file_id, page);
    }

    fn record_file(&mut self, file_id: u128, path: &str, bytes: u64) {
        if let Some(f) = self.files.iter_mut().find(|f| f.file_id == file_id) {
            f.bytes = f.bytes.saturating_add(bytes);
            f.reads += 1;
            return;
        }
        if self.files.len() < FILES_TRACKED {
            let mut p = String::with_capacity(path.len().max(PATH_RESERVE));
            p.push_str(path);
            self.files.push(FileSlot {
                file_id,
                path: p,
                bytes,
                error: 0,
                reads: 1,
            });
            return;
        }
        let i = argmin(self.files.iter().map(|f| f.bytes));
        let f = &mut self.files[i];
        f.file_id = file_id;
        f.path.clear();
        f.path.push_str(path);
        f.error = f.bytes;
        f.bytes = f.bytes.saturating_add(bytes);
        f.reads = 1;
    }

    fn record_page(&mut self, file_id: u128, page: u64) {
        if let Some(p) = self
            .pages
            .iter_mut()
            .find(|p| p.file_id == file_id && p.page == page)
        {
            p.reads += 1;
            return;
        }
        if self.pages.len() < PAGES_TRACKED {
            self.pages.push(PageSlot {
                file_id,
                page,
                reads: 1,
                error: 0,
            });
            return;
        }
        let i = argmin(self.pages.iter().map(|p| p.reads));
        let p = &mut self.pages[i];
        *p = PageSlot {
            file_id,
            page,
            reads: p.reads + 1,
            error: p.reads,
        };
    }

    /// Whether the per-mount table should be compared with the mount table now (at most once a
    /// second, and before the first use).
    pub fn mounts_due(&self, now: Instant) -> bool {
        self.mounts_checked
            .is_none_or(|at| now.saturating_duration_since(at) >= MOUNTS_REFRESH)
    }

    /// Follows the mount table `mounts` (credential-free, as the source shows it): counts of
    /// mounts that stay are kept, new mounts start at zero, removed ones are dropped. Prices
    /// come from the URLs' `egress_usd_per_tb` (0 if none; the table was checked when built).
    pub fn set_mounts(&mut self, mounts: &[MountEntry], now: Instant) {
        self.mounts_checked = Some(now);
        let same = mounts.len() == self.mounts.len()
            && mounts.iter().all(|m| {
                self.mounts
                    .iter()
                    .any(|s| s.prefix == m.prefix && s.usd_per_tb == price_of(&m.url))
            });
        if same {
            return;
        }
        let mut next: Vec<MountSlot> = Vec::with_capacity(mounts.len().min(MAX_MOUNTS));
        let mut prefix_bytes = 0;
        for m in mounts.iter().take(MAX_MOUNTS) {
            prefix_bytes += m.prefix.len();
            if prefix_bytes > MAX_MOUNT_TABLE_BYTES {
                break;
            }
            let (cache_bytes, store_bytes) = self
                .mounts
                .iter()
                .find(|s| s.prefix == m.prefix)
                .map_or((0, 0), |s| (s.cache_bytes, s.store_bytes));
            next.push(MountSlot {
                prefix: m.prefix.clone(),
                usd_per_tb: price_of(&m.url),
                cache_bytes,
                store_bytes,
            });
        }
        next.sort_by_key(|m| std::cmp::Reverse(m.prefix.len()));
        self.mounts = next;
    }

    fn mount_of(&mut self, path: &str) -> Option<&mut MountSlot> {
        self.mounts.iter_mut().find(|m| {
            m.prefix.is_empty()
                || path
                    .strip_prefix(m.prefix.as_str())
                    .is_some_and(|r| r.is_empty() || r.starts_with('/'))
        })
    }

    /// `bytes` of `path` served without a store read of this request's own.
    pub fn served_from_cache(&mut self, path: &str, bytes: u64) {
        if let Some(m) = self.mount_of(path) {
            m.cache_bytes = m.cache_bytes.saturating_add(bytes);
        }
    }

    /// `bytes` of `path` read from the under storage.
    pub fn read_from_store(&mut self, path: &str, bytes: u64) {
        if let Some(m) = self.mount_of(path) {
            m.store_bytes = m.store_bytes.saturating_add(bytes);
        }
    }

    /// The report: the hottest [`MAX_HOT_FILES`] files by bytes and [`MAX_HOT_PAGES`] pages by
    /// reads, and every mount's bytes.
    pub fn report(&self, shard: u16) -> HotReport {
        let mut files: Vec<&FileSlot> = self.files.iter().collect();
        files.sort_by_key(|f| std::cmp::Reverse(f.bytes));
        let mut pages = self.pages.clone();
        pages.sort_by_key(|p| std::cmp::Reverse(p.reads));
        HotReport {
            shard,
            files: files
                .into_iter()
                .take(MAX_HOT_FILES)
                .map(|f| HotFile {
                    file_id: FileId::from_u128(f.file_id),
                    path: f.path.clone(),
                    bytes: f.bytes,
                    bytes_error: f.error,
                    reads: f.reads,
                })
                .collect(),
            pages: pages
                .into_iter()
                .take(MAX_HOT_PAGES)
                .map(|p| HotPage {
                    key: Key {
                        file_id: FileId::from_u128(p.file_id),
                        page: p.page,
                    },
                    reads: p.reads,
                    reads_error: p.error,
                    spread: 0,
                })
                .collect(),
            mounts: self
                .mounts
                .iter()
                .map(|m| MountBytes {
                    prefix: m.prefix.clone(),
                    usd_per_tb: m.usd_per_tb,
                    cache_bytes: m.cache_bytes,
                    store_bytes: m.store_bytes,
                })
                .collect(),
        }
    }
}

fn price_of(url: &str) -> f64 {
    egress_price(url).ok().flatten().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn heavy_files_and_pages_are_found_among_many_light_ones() {
        let mut h = HotTracker::new();
        // Three heavy files among 10,000 light ones, interleaved.
        for i in 0..10_000u128 {
            h.record_read(1000 + i, &format!("/light/{i}"), 0, 1000);
            if i % 10 == 0 {
                for hot in 1..=3u128 {
                    h.record_read(
                        hot,
                        &format!("/hot/{hot}"),
                        (i / 10 % 2) as u64,
                        4000 * hot as u64,
                    );
                }
            }
        }
        let r = h.report(5);
        assert_eq!(r.shard, 5);
        assert_eq!(r.files.len(), MAX_HOT_FILES);
        let top: Vec<&str> = r.files.iter().take(3).map(|f| f.path.as_str()).collect();
        assert_eq!(top, ["/hot/3", "/hot/2", "/hot/1"]);
        // Heavy files stayed from their first read: exact counts, no error.
        for (f, hot) in r.files.iter().zip([3u64, 2, 1]) {
            assert_eq!(
                (f.bytes, f.bytes_error, f.reads),
                (1000 * 4000 * hot, 0, 1000)
            );
        }
        // Counts never under-count, and over-count by at most the error.
        for f in &r.files[3..] {
            assert!(f.bytes >= f.bytes_error + 1000 * f.reads, "{f:?}");
        }
        // The two pages read of each hot file are the hottest pages, 500 reads each.
        let hot_pages = r
            .pages
            .iter()
            .take(6)
            .filter(|p| p.key.file_id.as_u128() <= 3);
        assert_eq!(hot_pages.count(), 6);
        assert!(r.pages[..6]
            .iter()
            .all(|p| p.reads >= 500 && p.reads - p.reads_error >= 500));
        assert!(r.pages.len() <= MAX_HOT_PAGES);
        // The table never grew.
        assert_eq!(h.files.len(), FILES_TRACKED);
        assert_eq!(h.pages.len(), PAGES_TRACKED);
    }

    #[test]
    fn bytes_are_counted_per_mount_by_longest_prefix_and_survive_a_refresh() {
        let mut h = HotTracker::new();
        let now = Instant::now();
        assert!(h.mounts_due(now));
        let table = |extra: &[(&str, &str)]| {
            let mut v = vec![
                MountEntry {
                    prefix: "/data".into(),
                    url: "s3://b/p?egress_usd_per_tb=90".into(),
                },
                MountEntry {
                    prefix: "/data/inner".into(),
                    url: "file:///srv/inner".into(),
                },
            ];
            v.extend(extra.iter().map(|(p, u)| MountEntry {
                prefix: (*p).into(),
                url: (*u).into(),
            }));
            v
        };
        h.set_mounts(&table(&[]), now);
        assert!(!h.mounts_due(now));
        assert!(h.mounts_due(now + Duration::from_secs(1)));
        h.served_from_cache("/data/a.bin", 100);
        h.served_from_cache("/data/inner/b", 7);
        h.served_from_cache("/database/x", 1_000_000);
        h.read_from_store("/data", 40);
        let get = |h: &HotTracker, p: &str| {
            let r = h.report(0);
            let m = r.mounts.iter().find(|m| m.prefix == p).cloned().unwrap();
            (m.usd_per_tb, m.cache_bytes, m.store_bytes)
        };
        assert_eq!(get(&h, "/data"), (90.0, 100, 40));
        assert_eq!(get(&h, "/data/inner"), (0.0, 7, 0));
        // A mount added: the others keep their counts; one removed: gone.
        h.set_mounts(&table(&[("/models", "gs://m?egress_usd_per_tb=120")]), now);
        assert_eq!(get(&h, "/data"), (90.0, 100, 40));
        assert_eq!(get(&h, "/models"), (120.0, 0, 0));
        h.set_mounts(&table(&[])[..1], now);
        assert_eq!(h.report(0).mounts.len(), 1);
        h.served_from_cache("/data/inner/b", 3);
        assert_eq!(get(&h, "/data"), (90.0, 103, 40));
        crate::frame::encode_hot_report(&h.report(0)).unwrap();
    }
}
