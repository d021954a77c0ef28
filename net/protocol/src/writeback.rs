//! What both ends agree on about write-back: the version tags of files written through the
//! cluster, their file ids, the write policy of a mount, the hybrid logical clock that orders
//! namespace changes, and who holds a dirty page.
//!
//! A file written through the cluster to a `back` or `transient` mount gets a fresh *write-back
//! version* (a random tag, [`new_tag`]). Its pages are cached under the file id of that tag
//! alone ([`crate::ring::file_id`] leaves the path out for such tags), so a rename keeps them.
//! docs/ARCHITECTURE.md ("Write-back") has the whole design.

use std::fmt;

/// What every write-back version tag starts with.
pub const WB_TAG_PREFIX: &str = "wb1-";

/// Members after the first `write_replicas` that a writer may use for a page when some of
/// those are unreachable, and that readers ask before giving up on it.
pub const WRITE_SLOP: usize = 2;

/// A new write-back version tag from 128 random bits: `wb1-` and 32 lowercase hex digits.
pub fn new_tag(random: u128) -> String {
    format!("{WB_TAG_PREFIX}{random:032x}")
}

/// A fresh write-back version tag (from the operating system's random source).
pub fn fresh_tag() -> String {
    let mut b = [0u8; 16];
    // A failing random source leaves zeroes; mix in the clock and the process so that tags
    // still differ.
    if getrandom::fill(&mut b).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        b = (t ^ (u128::from(std::process::id()) << 96)).to_le_bytes();
    }
    new_tag(u128::from_le_bytes(b))
}

/// The digest of a sequence of write-back records that a `RecordsIn` request carries
/// (`digest`): 64-bit FNV-1a over each record in turn, its path's bytes, a 0xff byte (never in
/// UTF-8), then its rank (`FileRecord::order`: hlc as 8 little-endian bytes, origin as 16,
/// stage as 1); 1 where that comes to 0, which stands for no digest. Two nodes whose records
/// of a directory's entries have the same digest hold the same changes there.
pub fn records_digest<'a>(records: impl IntoIterator<Item = &'a crate::frame::FileRecord>) -> u64 {
    fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h
    }
    let mut h = 0xcbf2_9ce4_8422_2325;
    for r in records {
        let (hlc, origin, stage) = r.order();
        h = fnv(h, r.path.as_bytes());
        h = fnv(h, &[0xff]);
        h = fnv(h, &hlc.to_le_bytes());
        h = fnv(h, &origin.to_le_bytes());
        h = fnv(h, &[stage]);
    }
    h.max(1)
}

/// Whether `tag` is a write-back version tag ([`new_tag`]'s form exactly).
pub fn is_wb_tag(tag: &str) -> bool {
    tag.len() == WB_TAG_PREFIX.len() + 32
        && tag.starts_with(WB_TAG_PREFIX)
        && tag.as_bytes()[WB_TAG_PREFIX.len()..]
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
}

/// The refusal of a change that would put `path` beneath `file`, a file (with
/// [`ErrorCode::NotDir`](crate::frame::ErrorCode::NotDir)).
pub fn beneath_file(path: &str, file: &str) -> String {
    format!("{path}: {file} is a file: not a directory")
}

/// How a mount takes writes (the `write` parameter of its URL).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WritePolicy {
    /// Writes go to the under storage before they are acknowledged (the default).
    #[default]
    Through,
    /// Writes are acknowledged once durable on the cluster's write replicas and flushed to the
    /// under storage in the background.
    Back,
    /// Writes stay on the cluster (scratch space): durable on the write replicas, never
    /// flushed.
    Transient,
}

impl WritePolicy {
    /// `through`, `back` or `transient`.
    pub fn as_str(self) -> &'static str {
        match self {
            WritePolicy::Through => "through",
            WritePolicy::Back => "back",
            WritePolicy::Transient => "transient",
        }
    }

    /// Parses a policy name.
    pub fn parse(s: &str) -> Option<WritePolicy> {
        [
            WritePolicy::Through,
            WritePolicy::Back,
            WritePolicy::Transient,
        ]
        .into_iter()
        .find(|p| p.as_str() == s)
    }

    /// The policy a mount URL names with its `write` query parameter (`through` when it has
    /// none). An unknown value is an error naming the choices.
    pub fn of_url(url: &str) -> Result<WritePolicy, String> {
        let Some((_, query)) = url.split_once('?') else {
            return Ok(WritePolicy::Through);
        };
        let query = query.split('#').next().unwrap_or("");
        let mut policy = WritePolicy::Through;
        for pair in query.split('&') {
            if let Some(v) = pair.strip_prefix("write=") {
                policy = WritePolicy::parse(v).ok_or_else(|| {
                    format!("write={v}: the write policy is one of through, back, transient")
                })?;
            }
        }
        Ok(policy)
    }

    /// Whether writes of this policy go through the cluster's write-back path.
    pub fn is_cached(self) -> bool {
        self != WritePolicy::Through
    }
}

impl fmt::Display for WritePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// The write replicas a cluster of `nodes` nodes uses with setting `setting`: at least 1 and at
/// most the number of nodes.
pub fn effective_replicas(setting: u8, nodes: usize) -> usize {
    usize::from(setting).clamp(1, nodes.max(1))
}

/// A hybrid logical clock: values are `milliseconds << 16 | counter`, strictly increasing on
/// one node and never behind any value the node has seen from another, so that every change
/// made after another (anywhere) sorts after it.
///
/// It also keeps up with the fastest clock it has seen: a value from a node whose wall clock
/// runs ahead of this one's (by up to [`MAX_LEAD_MS`]) makes this clock run that far ahead too,
/// from then on, not only until its own wall clock passes the value. Without that, a change a
/// fast node stamped just before it died (and that this node never saw) could outrank a change
/// this node made after taking the dead node's paths over, whenever the clocks differ by more
/// than the time the takeover took: the one this node acknowledged would lose to one nobody
/// acknowledged.
#[derive(Debug, Default)]
pub struct Hlc {
    last: std::sync::atomic::AtomicU64,
    /// How many milliseconds the fastest clock seen runs ahead of this node's wall clock.
    lead_ms: std::sync::atomic::AtomicU64,
}

/// The most a peer's clock may run ahead of this node's and still be followed (a value further
/// ahead is still never sorted behind, as any value seen, but the lead it shows is not kept:
/// such a clock is wrong, and following it would age every record by it).
pub const MAX_LEAD_MS: u64 = 10 * 60 * 1000;

impl Hlc {
    /// A clock that has seen nothing yet.
    pub fn new() -> Hlc {
        Hlc::default()
    }

    /// The next value at wall clock `now_ms`.
    pub fn tick(&self, now_ms: u64) -> u64 {
        use std::sync::atomic::Ordering;
        let lead = self.lead_ms.load(Ordering::Relaxed);
        let wall = now_ms.saturating_add(lead) << 16;
        let mut cur = self.last.load(Ordering::Relaxed);
        loop {
            let next = wall.max(cur + 1);
            match self
                .last
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return next,
                Err(seen) => cur = seen,
            }
        }
    }

    /// Takes in a value seen from another node at wall clock `now_ms`: later ticks sort after
    /// it, and run as far ahead of the wall clock as it did (up to [`MAX_LEAD_MS`]). Returns
    /// the lead when this value made it larger.
    pub fn observe_at(&self, hlc: u64, now_ms: u64) -> Option<u64> {
        use std::sync::atomic::Ordering;
        self.last.fetch_max(hlc, Ordering::AcqRel);
        let ahead = hlc_ms(hlc).saturating_sub(now_ms);
        if ahead == 0 || ahead > MAX_LEAD_MS {
            return None;
        }
        let before = self.lead_ms.fetch_max(ahead, Ordering::AcqRel);
        (ahead > before).then_some(ahead)
    }

    /// [`Hlc::observe_at`] now.
    pub fn observe(&self, hlc: u64) -> Option<u64> {
        self.observe_at(hlc, unix_ms())
    }

    /// How far ahead of the wall clock this clock runs (milliseconds).
    pub fn lead_ms(&self) -> u64 {
        self.lead_ms.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The wall clock now as this clock runs it (ahead by the lead): the time to measure the
    /// age of a stamp against, so that following a fast clock does not make stamps look
    /// younger than they are.
    pub fn now_ms(&self) -> u64 {
        unix_ms().saturating_add(self.lead_ms())
    }

    /// The next value now.
    pub fn now(&self) -> u64 {
        self.tick(unix_ms())
    }
}

/// The wall-clock milliseconds of an HLC value.
pub fn hlc_ms(hlc: u64) -> u64 {
    hlc >> 16
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Nanoseconds since the Unix epoch (a file's mtime).
pub fn unix_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// The parent directory of an absolute logical path ("/" for a top-level name; `None` for "/").
pub fn parent(path: &str) -> Option<&str> {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        return None;
    }
    match trimmed.rfind('/') {
        Some(0) => Some("/"),
        Some(i) => Some(&trimmed[..i]),
        None => None,
    }
}

/// Longest name (path segment) a written path may have, in bytes: a file name on the file
/// systems under the cache (`NAME_MAX`), and pages3's limit for written keys.
pub const MAX_NAME_LEN: usize = 255;

/// Checks a path a write-back change names (a file committed or deleted, a directory made or
/// removed, both sides of a rename) and a path written through a `through` mount against the
/// one spelling the cluster keeps: absolute, not the root, no empty segment (no `//`, no
/// trailing `/`), no `.` or `..` segment, no ASCII control character (stores' paths take
/// none), names of at most [`MAX_NAME_LEN`] bytes, at most
/// [`MAX_PATH_LEN`](crate::frame::MAX_PATH_LEN) bytes in all.
/// Stores spell `/a//b` and `/a/b/` as `a/b`: kept as paths of their own, they would be
/// second names for one object, each with its own record (a deletion of `/a/b/` would delete
/// the object behind `/a/b`'s newer record). `Err` says why, naming the path.
pub fn check_change_path(path: &str) -> Result<(), String> {
    let why = if !path.starts_with('/') {
        "it is not absolute".to_string()
    } else if path == "/" {
        "it is the root".to_string()
    } else if path.len() > crate::frame::MAX_PATH_LEN {
        format!(
            "it has {} bytes, more than {}",
            path.len(),
            crate::frame::MAX_PATH_LEN
        )
    } else if let Some(c) = path.chars().find(|c| c.is_ascii_control()) {
        format!("it contains the control character U+{:04X}", c as u32)
    } else if let Some(seg) = path[1..]
        .split('/')
        .find(|s| s.is_empty() || *s == "." || *s == "..")
    {
        if seg.is_empty() {
            "it has an empty segment (a doubled or trailing /)".to_string()
        } else {
            format!("it has a {seg} segment")
        }
    } else if let Some(seg) = path[1..].split('/').find(|s| s.len() > MAX_NAME_LEN) {
        format!(
            "a name in it has {} bytes, more than {MAX_NAME_LEN}",
            seg.len()
        )
    } else {
        return Ok(());
    };
    Err(refused(path, &why))
}

/// Checks a path a read names (a stat, a listing, a file's pages): absolute, no `.` or `..`
/// segment, no NUL, and no empty segment but one trailing `/` (a directory may be named with
/// its slash). Stores spell `/a//b` as `a/b`: taken as a path of its own it would be a second
/// name, and a second cached copy, of that object. `Err` says why, naming the path.
pub fn check_read_path(path: &str) -> Result<(), String> {
    // The segments after the leading `/`: only the last may be empty (`/`, `/a/`).
    let segments = || path.get(1..).unwrap_or_default().split('/');
    let last = segments().count() - 1;
    let why = if !path.starts_with('/') {
        "it is not absolute"
    } else if path.contains('\0') {
        "it contains a NUL byte"
    } else if segments()
        .enumerate()
        .any(|(i, s)| s.is_empty() && i < last)
    {
        "it has an empty segment (a doubled /)"
    } else if segments().any(|s| s == "." || s == "..") {
        "it has a . or .. segment"
    } else {
        return Ok(());
    };
    Err(refused(path, why))
}

/// Why `path` is refused, naming it (its first 200 characters).
fn refused(path: &str, why: &str) -> String {
    let shown: String = path.chars().take(200).collect();
    let more = if shown.len() < path.len() { "..." } else { "" };
    format!("{shown:?}{more}: {why}")
}

/// A node's write-back side as its shards see it: the namespace of `back` and `transient`
/// mounts (records of the files, directories and deletions made through the cluster), kept
/// durably by every node. The daemon implements it on its tokio runtime; the futures it returns
/// run there. Calls must be cheap from any thread.
pub trait WriteBack: Send + Sync + 'static {
    /// Whether pages of write-back version `file_id` may still be written: no record says the
    /// version was closed by its writer, sealed, flushed or deleted, and, when no record names
    /// it, its writer's `since` (the position of its first answered commit, 0 before it) is
    /// not so old that its record may have been forgotten.
    fn takes_pages(&self, file_id: u128, since: u64) -> bool;
    /// Whether a record this node holds names write-back version `file_id` (a committed
    /// file, or one deleted after its commit): such a version's pages are not given up at a
    /// writer's `Discard`.
    fn names(&self, file_id: u128) -> bool;
    /// A namespace change asked by a client: ordered, kept durably on this node, handed to the
    /// other nodes; the answer is its position in the cluster's order, once the cluster's
    /// write replicas hold it.
    fn change(&self, op: crate::frame::ChangeOp) -> crate::source::SourceFuture<u64>;
    /// Records another node made: applied and kept durably; the answer is the largest position.
    fn replicate(&self, records: Vec<crate::frame::FileRecord>)
        -> crate::source::SourceFuture<u64>;
    /// The records whose paths sort after `after`, in path order, as many as one answer holds,
    /// and whether more follow.
    fn pull(&self, after: &str) -> (Vec<crate::frame::FileRecord>, bool);
    /// The records this node holds of `paths` (none for a path it has no record of), and for
    /// each path the first live record beneath it, if any (what makes it a directory).
    fn records_of(&self, paths: &[String]) -> Vec<crate::frame::FileRecord>;
    /// The records this node holds of directory `dir`'s entries named after `after`, in name
    /// order (each entry's own record and, for a directory records beneath it imply, the first
    /// live one beneath it), as many as one answer holds, and whether entries were left out;
    /// `None` when `digest` is theirs, all pages together ([`records_digest`]): the asker
    /// holds the same.
    fn records_in(
        &self,
        dir: &str,
        after: &str,
        digest: u64,
    ) -> Option<(Vec<crate::frame::FileRecord>, bool)>;
    /// Whether this node is still taking its peers' records after its start: what it would
    /// answer from its records (a summary, attributes) may miss changes the cluster
    /// acknowledged while it was down, so it refuses such questions as unavailable.
    fn catching_up(&self) -> bool;
    /// What waits to reach the under storage under `prefix`, as this node knows it.
    fn summary(&self, prefix: &str) -> crate::frame::WriteBackSummary;
    /// The attributes of write-back version `version_tag` of the file at `path`, if the
    /// records name that version there.
    fn attributes(&self, path: &str, version_tag: &str) -> Option<Vec<crate::frame::Attr>>;
    /// The write replicas in force (at least 1).
    fn write_replicas(&self) -> u8;
    /// The write replicas as configured, before they are clamped to the ring's nodes (what
    /// `ClusterInfo` tells clients, who clamp it as the ring they follow changes).
    fn write_setting(&self) -> u8;
    /// How long after the newest page (or the writer's newest `Renew`) this node drops the
    /// pages of a write-back version that no record names: a writer gone before its first
    /// commit.
    fn orphan_grace(&self) -> std::time::Duration;
}

/// The nodes' default orphan grace (`--write-orphan-grace`): how long the dirty pages of a
/// version no record names outlive its newest page or renewal. A writer assumes it until a
/// member tells it its own.
pub const DEFAULT_ORPHAN_GRACE: std::time::Duration = std::time::Duration::from_secs(120);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{FileId, FileRecord, RecordEntry};

    /// The digest as docs/PROTOCOL.md (`RecordsIn`) spells it, computed there by hand: a
    /// node built from other code must agree with it byte for byte.
    #[test]
    fn the_records_digest_is_the_documented_fnv_1a() {
        let records = [
            FileRecord {
                path: "/ck/d/a".into(),
                hlc: 0x0102_0304_0506_0708,
                origin: FileId::from_u128(0x1112_1314_1516_1718_2122_2324_2526_2728),
                entry: RecordEntry::Dir { mtime_ns: 5 },
            },
            FileRecord {
                path: "/ck/d/b".into(),
                hlc: 9,
                origin: FileId::from_u128(1),
                entry: RecordEntry::Deleted {
                    prev_tag: String::new(),
                    pending: false,
                },
            },
        ];
        assert_eq!(records_digest(&records), 0x4241_2cae_2433_c7f1);
        // No record: the offset basis.
        assert_eq!(records_digest(&[]), 0xcbf2_9ce4_8422_2325);
        // Order matters; so does the stage.
        assert_ne!(records_digest(records.iter().rev()), 0x4241_2cae_2433_c7f1);
        let mut applied = records.clone();
        applied[1].entry = RecordEntry::Deleted {
            prev_tag: String::new(),
            pending: true,
        };
        assert_ne!(records_digest(&applied), 0x4241_2cae_2433_c7f1);
    }

    #[test]
    fn a_changed_path_has_one_spelling() {
        let long = "n".repeat(MAX_NAME_LEN);
        for good in [
            "/a",
            "/a/b.txt",
            "/ck/.hidden",
            "/a/...",
            &format!("/d/{long}"),
        ] {
            assert_eq!(check_change_path(good), Ok(()), "{good}");
        }
        for (bad, why) in [
            ("", "not absolute"),
            ("a/b", "not absolute"),
            ("/", "the root"),
            ("//a", "empty segment"),
            ("/a//b", "empty segment"),
            ("/a/b/", "empty segment"),
            ("/a/./b", "a . segment"),
            ("/a/../b", "a .. segment"),
            ("/a/b\0", "U+0000"),
            ("/a/b\nc", "U+000A"),
            ("/a/\x7f", "U+007F"),
        ] {
            let e = check_change_path(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
        let e = check_change_path(&format!("/d/{long}n")).unwrap_err();
        assert!(e.contains("256 bytes, more than 255"), "{e}");
        assert!(e.contains("\"...: a name"), "{e}");
        let e = check_change_path(&format!("/{}", "d/".repeat(2100))).unwrap_err();
        assert!(e.contains("more than 4096"), "{e}");
    }

    #[test]
    fn a_read_path_has_one_spelling_but_a_directory_may_end_in_a_slash() {
        for good in [
            "/",
            "/a",
            "/a/",
            "/a/b.txt",
            "/a/b/",
            "/ck/.hidden",
            "/a/...",
        ] {
            assert_eq!(check_read_path(good), Ok(()), "{good}");
        }
        for (bad, why) in [
            ("", "not absolute"),
            ("a/b", "not absolute"),
            ("//", "empty segment"),
            ("//a", "empty segment"),
            ("/a//b", "empty segment"),
            ("/a/b//", "empty segment"),
            ("/a/./b", ". or .. segment"),
            ("/a/..", ". or .. segment"),
            ("/..", ". or .. segment"),
            ("/a/b\0", "NUL"),
        ] {
            let e = check_read_path(bad).expect_err(bad);
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn tags_have_one_form() {
        let t = new_tag(0xabc);
        assert_eq!(t, "wb1-00000000000000000000000000000abc");
        assert!(is_wb_tag(&t));
        assert!(is_wb_tag(&fresh_tag()));
        assert_ne!(fresh_tag(), fresh_tag());
        for bad in [
            "",
            "wb1-",
            "wb1-00000000000000000000000000000ABC",
            "wb1-00000000000000000000000000000abcd",
            "wb2-00000000000000000000000000000abc",
            "\"d41d8cd98f00b204e9800998ecf8427e\"",
            "1700000000000000000-12",
        ] {
            assert!(!is_wb_tag(bad), "{bad}");
        }
    }

    #[test]
    fn policies_come_from_the_url() {
        assert_eq!(
            WritePolicy::of_url("file:///srv/x"),
            Ok(WritePolicy::Through)
        );
        assert_eq!(
            WritePolicy::of_url("file:///srv/x?write=back"),
            Ok(WritePolicy::Back)
        );
        assert_eq!(
            WritePolicy::of_url("s3://b/p?endpoint=http://h:9000&write=transient"),
            Ok(WritePolicy::Transient)
        );
        assert_eq!(
            WritePolicy::of_url("file:///srv/x?emulate_latency_ms=3"),
            Ok(WritePolicy::Through)
        );
        let e = WritePolicy::of_url("file:///srv/x?write=later").unwrap_err();
        assert!(e.contains("through, back, transient"), "{e}");
    }

    #[test]
    fn replicas_stay_within_the_nodes() {
        assert_eq!(effective_replicas(2, 1), 1);
        assert_eq!(effective_replicas(2, 3), 2);
        assert_eq!(effective_replicas(0, 3), 1);
        assert_eq!(effective_replicas(5, 3), 3);
        assert_eq!(effective_replicas(2, 0), 1);
    }

    #[test]
    fn the_clock_never_goes_back() {
        let c = Hlc::new();
        let a = c.tick(1000);
        let b = c.tick(1000);
        let d = c.tick(999);
        assert!(a < b && b < d);
        assert_eq!(hlc_ms(a), 1000);
        c.observe_at(5000 << 16, 1001);
        assert!(c.tick(1001) > 5000 << 16);
    }

    /// A fast node (its clock 30 s ahead) stamps changes; this node sees one of them, then
    /// (the fast node dead, its paths taken over 2 s later) stamps a change: it sorts after
    /// every value the fast node could have stamped before it died, seen here or not.
    #[test]
    fn the_clock_keeps_up_with_the_fastest_clock_seen() {
        let skew = 30_000;
        let fast = Hlc::new();
        let here = Hlc::new();
        let t0 = 1_000_000;
        let seen = fast.tick(t0 + skew);
        assert_eq!(here.observe_at(seen, t0 + 1), Some(skew - 1));
        // The fast node's last stamp, 500 ms later, never reached this node.
        let unseen = fast.tick(t0 + 500 + skew);
        let takeover = here.tick(t0 + 2_500);
        assert!(takeover > unseen, "{takeover} <= {unseen}");
        assert_eq!(here.lead_ms(), skew - 1);
        // Ages are measured on the clock as it runs: ahead by the lead.
        let (before, now, after) = (unix_ms(), here.now_ms(), unix_ms());
        assert!((before + skew - 1..=after + skew - 1).contains(&now));
        // Values from slower clocks, or the same lead again, change nothing.
        assert_eq!(here.observe_at(5 << 16, t0 + 3_000), None);
        assert_eq!(
            here.observe_at(fast.tick(t0 + 3_000 + skew), t0 + 3_001),
            None
        );
        assert_eq!(here.lead_ms(), skew - 1);
        // A clock too far ahead is never sorted behind, but not followed.
        let wild = (t0 + 3_000 + MAX_LEAD_MS + 1) << 16;
        assert_eq!(here.observe_at(wild, t0 + 3_000), None);
        assert_eq!(here.lead_ms(), skew - 1);
        assert!(here.tick(t0 + 3_001) > wild);
    }

    #[test]
    fn parents() {
        assert_eq!(parent("/a/b/c"), Some("/a/b"));
        assert_eq!(parent("/a"), Some("/"));
        assert_eq!(parent("/a/"), Some("/"));
        assert_eq!(parent("/"), None);
    }
}
