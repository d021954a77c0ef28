//! What the gateway remembers of the objects it wrote: S3's ETag (the MD5 of the bytes for a
//! PutObject, `md5-N` for a multipart upload), the checksums the writer named or the upload's
//! algorithm gave, and a multipart object's parts (sizes and checksums, for reads of one part
//! and GetObjectAttributes). Kept by logical path with the store version they describe, while
//! the object keeps that version and while this gateway runs; forgetting only changes what
//! later reads report (the store's tag, no checksum, the object as one part).

use std::{collections::HashMap, sync::Mutex};

use super::checks::Checksums;

/// Objects remembered.
const MAX_ALIASES: usize = 100_000;

/// Parts remembered, over all objects (an upload has at most 10,000).
const MAX_PARTS: usize = 1_000_000;

/// A part of a multipart object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct PartInfo {
    /// Its number in the upload (the parts of an object ascend, not always by 1).
    pub(super) number: i32,
    pub(super) size: u64,
    /// The part's checksums (by the upload's algorithm, when it had one).
    pub(super) checksums: Checksums,
}

/// Part `number` of an object, as a read of that part answers it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct PartOf {
    /// Its bytes in the object.
    pub(super) start: u64,
    pub(super) end: u64,
    /// How many parts the object has.
    pub(super) count: usize,
    /// The part's checksums, typed as the object's (S3 gives a part's checksum with the
    /// object's `ChecksumType`).
    pub(super) checksums: Checksums,
}

/// One page of an object's parts (GetObjectAttributes `ObjectParts`).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct PartsPage {
    pub(super) total: usize,
    pub(super) parts: Vec<PartInfo>,
    pub(super) truncated: bool,
}

struct Alias {
    version: String,
    etag: String,
    checksums: Checksums,
    /// Empty for an object written in one piece.
    parts: Box<[PartInfo]>,
}

#[derive(Default)]
struct Map {
    by_path: HashMap<String, Alias>,
    /// Parts of all the aliases.
    parts: usize,
}

#[derive(Default)]
pub(super) struct Aliases(Mutex<Map>);

impl Aliases {
    fn lock(&self) -> std::sync::MutexGuard<'_, Map> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn with<T>(&self, path: &str, version: &str, f: impl FnOnce(&Alias) -> T) -> Option<T> {
        let m = self.lock();
        m.by_path.get(path).filter(|a| a.version == version).map(f)
    }

    /// Whether version `version` of `path` is known here.
    pub(super) fn knows(&self, path: &str, version: &str) -> bool {
        self.with(path, version, |_| ()).is_some()
    }

    /// The S3 ETag of version `version` of `path`, if this gateway wrote it.
    pub(super) fn get(&self, path: &str, version: &str) -> Option<String> {
        self.with(path, version, |a| a.etag.clone())
    }

    /// The checksums of version `version` of `path`, if this gateway wrote it.
    pub(super) fn checksums(&self, path: &str, version: &str) -> Option<Checksums> {
        self.with(path, version, |a| a.checksums.clone())
    }

    /// Part `number` of version `version` of `path`: `None` if this gateway does not know the
    /// object as a multipart one; `Some(Err(count))` if it has no such part (`count` parts).
    pub(super) fn part(
        &self,
        path: &str,
        version: &str,
        number: i32,
    ) -> Option<Result<PartOf, usize>> {
        self.with(path, version, |a| {
            if a.parts.is_empty() {
                return None;
            }
            let count = a.parts.len();
            let Ok(i) = a.parts.binary_search_by_key(&number, |p| p.number) else {
                return Some(Err(count));
            };
            let part = &a.parts[i];
            let start: u64 = a.parts[..i].iter().map(|p| p.size).sum();
            Some(Ok(PartOf {
                start,
                end: start + part.size,
                count,
                checksums: Checksums {
                    composite: a.checksums.composite,
                    ..part.checksums.clone()
                },
            }))
        })
        .flatten()
    }

    /// At most `max` parts after part number `marker` of version `version` of `path`, if this
    /// gateway knows the object as a multipart one.
    pub(super) fn parts_page(
        &self,
        path: &str,
        version: &str,
        marker: i32,
        max: usize,
    ) -> Option<PartsPage> {
        self.with(path, version, |a| {
            if a.parts.is_empty() {
                return None;
            }
            let skip = a.parts.partition_point(|p| p.number <= marker);
            let parts: Vec<PartInfo> = a.parts[skip..].iter().take(max).cloned().collect();
            Some(PartsPage {
                total: a.parts.len(),
                truncated: skip.saturating_add(max) < a.parts.len(),
                parts,
            })
        })
        .flatten()
    }

    /// Remembers version `version` of `path`: its ETag, checksums and parts (empty for an
    /// object written in one piece).
    pub(super) fn set(
        &self,
        path: &str,
        version: &str,
        etag: &str,
        checksums: Checksums,
        parts: Vec<PartInfo>,
    ) {
        let mut m = self.lock();
        if let Some(old) = m.by_path.remove(path) {
            m.parts -= old.parts.len();
        }
        if m.by_path.len() >= MAX_ALIASES || m.parts + parts.len() > MAX_PARTS {
            // Forgetting only changes what later reads report.
            *m = Map::default();
        }
        let parts = parts.into_boxed_slice();
        m.parts += parts.len();
        let alias = Alias {
            version: version.to_string(),
            etag: etag.to_string(),
            checksums,
            parts,
        };
        m.by_path.insert(path.to_string(), alias);
    }

    pub(super) fn forget(&self, path: &str) {
        let mut m = self.lock();
        if let Some(old) = m.by_path.remove(path) {
            m.parts -= old.parts.len();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn part(number: i32, size: u64, sum: &str) -> PartInfo {
        PartInfo {
            number,
            size,
            checksums: Checksums::one(3, sum.to_string(), false),
        }
    }

    #[test]
    fn a_multipart_objects_parts_are_found_by_number_and_paged() {
        let a = Aliases::default();
        let object = Checksums::one(3, "all-3".into(), true);
        a.set(
            "/b/k",
            "v1",
            "tag-3",
            object,
            vec![part(1, 5, "p1"), part(2, 5, "p2"), part(4, 2, "p4")],
        );
        let p2 = a.part("/b/k", "v1", 2).unwrap().unwrap();
        assert_eq!((p2.start, p2.end, p2.count), (5, 10, 3));
        assert_eq!(p2.checksums.values[3].as_deref(), Some("p2"));
        assert!(p2.checksums.composite, "typed as the object's checksum");
        // Parts keep their numbers from the upload, which need not follow each other.
        let p4 = a.part("/b/k", "v1", 4).unwrap().unwrap();
        assert_eq!((p4.start, p4.end), (10, 12));
        assert_eq!(a.part("/b/k", "v1", 3), Some(Err(3)));
        assert_eq!(a.part("/b/k", "v1", 5), Some(Err(3)));
        assert_eq!(a.part("/b/k", "v1", 0), Some(Err(3)));
        // Another version, or another object, is not known.
        assert_eq!(a.part("/b/k", "v2", 1), None);
        assert_eq!(a.part("/b/other", "v1", 1), None);

        let page = a.parts_page("/b/k", "v1", 1, 1).unwrap();
        assert_eq!(page.total, 3);
        assert!(page.truncated);
        assert_eq!(page.parts.len(), 1);
        assert_eq!(page.parts[0].number, 2);
        let page = a.parts_page("/b/k", "v1", 1, 10).unwrap();
        assert!(!page.truncated);
        assert_eq!(
            page.parts.iter().map(|p| p.number).collect::<Vec<_>>(),
            vec![2, 4]
        );
        let page = a.parts_page("/b/k", "v1", 2, 10).unwrap();
        assert_eq!(page.parts.len(), 1);
        assert!(!page.truncated);
        assert!(a.parts_page("/b/k", "v1", 4, 10).unwrap().parts.is_empty());
    }

    #[test]
    fn an_object_written_in_one_piece_has_no_parts_and_the_count_follows_replacements() {
        let a = Aliases::default();
        a.set(
            "/b/k",
            "v1",
            "t",
            Checksums::default(),
            (1..=4).map(|n| part(n, 1, "x")).collect(),
        );
        assert_eq!(a.lock().parts, 4);
        a.set("/b/k", "v2", "t2", Checksums::default(), Vec::new());
        assert_eq!(a.lock().parts, 0);
        assert_eq!(a.part("/b/k", "v2", 1), None);
        assert!(a.parts_page("/b/k", "v2", 0, 10).is_none());
        assert_eq!(a.get("/b/k", "v2").as_deref(), Some("t2"));
        a.set(
            "/b/j",
            "v1",
            "t",
            Checksums::default(),
            (1..=2).map(|n| part(n, 1, "x")).collect(),
        );
        a.forget("/b/j");
        assert_eq!(a.lock().parts, 0);
        assert_eq!(a.get("/b/j", "v1"), None);
    }
}
