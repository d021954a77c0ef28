//! Cache rules per logical-path prefix: a quota, a TTL and a pin.
//!
//! A [`Rules`] table is fixed for the life of an engine ([`crate::EngineConfig::rules`]). Every
//! page is stored with the number of the rule that covers its file's logical path (the longest
//! matching prefix, matched on whole path components), or [`NO_RULE`]. The number is kept in the
//! page's slot header (docs/FORMAT.md), so the per-rule accounting survives a restart; the shards
//! enforce the rules (see [`crate::index`]):
//!
//! - `quota`: bytes of this node's cache the rule's pages may take. Each shard enforces
//!   `quota / shards`, counted in whole pages (a short page occupies a whole slot). A rule at its
//!   quota evicts its own oldest page first.
//! - `ttl`: a page older than this is never served: a lookup treats it as a miss and drops it.
//! - `pin`: the rule's pages are never evicted, up to [`PIN_CAP_PERCENT`] of a shard's slots
//!   (pinned pages of every kind counted); pages past the cap are cached unpinned and counted.
//!
//! Rule numbers are the positions in the table sorted by prefix (1-based). Each cache file
//! records a fingerprint of the prefixes it was written under; when the set of prefixes changes,
//! the pages cached under the old set are dropped at the next start (a page's rule cannot be
//! recomputed without its path, and a wrong rule could serve a page past a TTL).

use std::time::Duration;

use crate::error::StartError;

/// The rule number of pages no rule covers.
pub const NO_RULE: u8 = 0;
/// The most rules a table may hold (rule numbers are one byte; 0 is "no rule").
pub const MAX_RULES: usize = 255;
/// Rule pins stop at this share of a shard's slots (pinned pages of every kind counted), so a
/// pin rule cannot fill the cache with pages nothing can evict.
pub const PIN_CAP_PERCENT: u32 = 90;

/// One rule: what applies to the pages of files under `prefix`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Logical path prefix, matched on whole components: `/data/a` covers `/data/a` and
    /// `/data/a/x`, not `/data/ab`. A trailing `/` is ignored; `/` covers everything.
    pub prefix: String,
    /// Bytes of this node's cache the rule's pages may take (each shard enforces its share).
    pub quota: Option<u64>,
    /// Pages older than this are never served.
    pub ttl: Option<Duration>,
    /// The rule's pages are never evicted (up to the pin cap).
    pub pin: bool,
}

/// What one shard's index enforces for one rule (see [`Rules::limits`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleLimits {
    /// The most pages of the rule this shard keeps (Ready plus being written).
    pub quota_pages: Option<u32>,
    /// Pages at least this old (in the caller's milliseconds) are expired.
    pub ttl_ms: Option<u64>,
    /// Pages are pinned when stored (up to the pin cap).
    pub pin: bool,
}

/// A validated rule table, sorted by prefix; rule `n` (1-based) is the `n`-th.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rules {
    rules: Vec<Rule>,
}

fn bad(m: String) -> StartError {
    StartError::Config(m)
}

/// The canonical form of a rule prefix: starts with `/`, no trailing `/` (except `/` itself), no
/// empty, `.` or `..` components.
fn normalize(prefix: &str) -> Result<String, StartError> {
    if !prefix.starts_with('/') {
        return Err(bad(format!(
            "rule prefix {prefix:?} must be a logical path starting with /"
        )));
    }
    if prefix.contains('\0') {
        return Err(bad(format!("rule prefix {prefix:?} contains a NUL byte")));
    }
    let trimmed = prefix.trim_end_matches('/');
    if trimmed.is_empty() {
        return Ok("/".to_string());
    }
    if trimmed[1..]
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(bad(format!(
            "rule prefix {prefix:?} has an empty, . or .. component"
        )));
    }
    Ok(trimmed.to_string())
}

/// Whether `path` is `prefix` or below it (component-wise). `prefix` is normalized.
fn covers(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

impl Rules {
    /// Validates and sorts `rules`: prefixes are normalized (see [`Rule::prefix`]) and must be
    /// distinct; each rule sets at least one of quota, ttl and pin; a quota is at least 1 byte and
    /// a TTL at least 1 ms; at most [`MAX_RULES`] rules.
    ///
    /// # Errors
    ///
    /// [`StartError::Config`] naming the rule and what is wrong with it.
    pub fn new(rules: Vec<Rule>) -> Result<Rules, StartError> {
        if rules.len() > MAX_RULES {
            return Err(bad(format!(
                "{} rules given, at most {MAX_RULES} are supported",
                rules.len()
            )));
        }
        let mut out = Vec::with_capacity(rules.len());
        for mut r in rules {
            r.prefix = normalize(&r.prefix)?;
            if r.quota.is_none() && r.ttl.is_none() && !r.pin {
                return Err(bad(format!(
                    "rule {}: set at least one of quota, ttl and pin",
                    r.prefix
                )));
            }
            if r.quota == Some(0) {
                return Err(bad(format!("rule {}: a quota must be above 0", r.prefix)));
            }
            if r.ttl.is_some_and(|t| t < Duration::from_millis(1)) {
                return Err(bad(format!(
                    "rule {}: a ttl must be at least 1 ms",
                    r.prefix
                )));
            }
            out.push(r);
        }
        out.sort_by(|a, b| a.prefix.cmp(&b.prefix));
        if let Some(w) = out.windows(2).find(|w| w[0].prefix == w[1].prefix) {
            return Err(bad(format!(
                "rule prefix {} appears twice (a trailing / does not make a new prefix); merge \
                 the two rules",
                w[0].prefix
            )));
        }
        Ok(Rules { rules: out })
    }

    /// No rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// The rule number for a file's logical path: the rule with the longest prefix covering it,
    /// or [`NO_RULE`]. A linear scan: call it once per load, not per read.
    pub fn classify(&self, path: &str) -> u8 {
        let mut best = (0usize, NO_RULE);
        for (i, r) in self.rules.iter().enumerate() {
            if covers(&r.prefix, path) && (best.1 == NO_RULE || r.prefix.len() > best.0) {
                // At most MAX_RULES (255) rules, so i + 1 fits a u8.
                best = (r.prefix.len(), (i + 1) as u8);
            }
        }
        best.1
    }

    /// Rule number `n` (1-based), if there is one.
    pub fn get(&self, n: u8) -> Option<&Rule> {
        usize::from(n)
            .checked_sub(1)
            .and_then(|i| self.rules.get(i))
    }

    /// The rules with their numbers, in number (prefix) order.
    pub fn iter(&self) -> impl Iterator<Item = (u8, &Rule)> {
        // At most MAX_RULES rules.
        self.rules
            .iter()
            .enumerate()
            .map(|(i, r)| ((i + 1) as u8, r))
    }

    /// A fingerprint of the prefixes and their numbers (FNV-1a, stable across builds); 0 for no
    /// rules. Cache files record it: pages written under another set of prefixes are dropped.
    pub fn fingerprint(&self) -> u64 {
        if self.rules.is_empty() {
            return 0;
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for r in &self.rules {
            for &b in r.prefix.as_bytes().iter().chain(&[0u8]) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        h.max(1)
    }

    /// What each shard enforces, indexed by rule number (entry 0 is [`NO_RULE`]: no limits), for
    /// an engine of `shards` shards and `page_size`-byte pages. A quota becomes whole pages per
    /// shard, rounded down.
    ///
    /// # Errors
    ///
    /// [`StartError::Config`] if a quota is smaller than one page per shard.
    pub fn limits(&self, shards: usize, page_size: u32) -> Result<Vec<RuleLimits>, StartError> {
        let mut out = vec![RuleLimits::default()];
        let unit = u64::from(page_size) * shards.max(1) as u64;
        for r in &self.rules {
            let quota_pages = match r.quota {
                None => None,
                Some(q) if q < unit => {
                    return Err(bad(format!(
                        "rule {}: quota {q} bytes is less than one {page_size}-byte page per \
                         shard ({shards} shards); the smallest quota here is {unit} bytes",
                        r.prefix
                    )))
                }
                Some(q) => Some(u32::try_from(q / unit).unwrap_or(u32::MAX)),
            };
            out.push(RuleLimits {
                quota_pages,
                ttl_ms: r
                    .ttl
                    .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
                pin: r.pin,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rule(prefix: &str) -> Rule {
        Rule {
            prefix: prefix.into(),
            quota: None,
            ttl: None,
            pin: true,
        }
    }

    #[test]
    fn longest_prefix_on_whole_components_wins() {
        let rules = Rules::new(vec![
            rule("/data/a/"),
            rule("/data"),
            rule("/data/a/deep"),
            rule("/"),
        ])
        .unwrap();
        let names: Vec<&str> = rules.iter().map(|(_, r)| r.prefix.as_str()).collect();
        assert_eq!(names, ["/", "/data", "/data/a", "/data/a/deep"]);
        let n = |p: &str| rules.get(rules.classify(p)).map(|r| r.prefix.as_str());
        assert_eq!(n("/data/a/x"), Some("/data/a"));
        assert_eq!(n("/data/a"), Some("/data/a"));
        assert_eq!(n("/data/ab/x"), Some("/data"));
        assert_eq!(n("/data/a/deep/er"), Some("/data/a/deep"));
        assert_eq!(n("/data/a/deeper"), Some("/data/a"));
        assert_eq!(n("/other"), Some("/"));
        let no_root = Rules::new(vec![rule("/data/a")]).unwrap();
        assert_eq!(no_root.classify("/data/ab"), NO_RULE);
        assert_eq!(no_root.classify("/data"), NO_RULE);
        assert_eq!(no_root.classify("/data/a/b"), 1);
        assert_eq!(no_root.get(0), None);
        assert_eq!(no_root.get(2), None);
    }

    #[test]
    fn bad_tables_are_refused_with_the_reason() {
        let err = |rules: Vec<Rule>| Rules::new(rules).unwrap_err().to_string();
        assert!(err(vec![rule("/a/"), rule("/a")]).contains("appears twice"));
        assert!(err(vec![rule("data")]).contains("starting with /"));
        assert!(err(vec![rule("/a//b")]).contains("component"));
        assert!(err(vec![rule("/a/../b")]).contains("component"));
        let mut none = rule("/a");
        none.pin = false;
        assert!(err(vec![none.clone()]).contains("at least one of"));
        let mut zero = none.clone();
        zero.quota = Some(0);
        assert!(err(vec![zero]).contains("above 0"));
        let mut short = none;
        short.ttl = Some(Duration::from_micros(10));
        assert!(err(vec![short]).contains("1 ms"));
        let many: Vec<Rule> = (0..256).map(|i| rule(&format!("/r{i}"))).collect();
        assert!(err(many).contains("at most 255"));
    }

    #[test]
    fn limits_split_quotas_over_shards_in_whole_pages() {
        let mut a = rule("/a");
        a.quota = Some(10 << 20);
        a.pin = false;
        let mut b = rule("/b");
        b.ttl = Some(Duration::from_secs(2));
        let rules = Rules::new(vec![b, a.clone()]).unwrap();
        let l = rules.limits(2, 1 << 20).unwrap();
        assert_eq!(l.len(), 3);
        assert_eq!(l[0], RuleLimits::default());
        assert_eq!(l[1].quota_pages, Some(5));
        assert_eq!(l[2].ttl_ms, Some(2000));
        assert!(l[2].pin);
        let e = rules.limits(16, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("rule /a") && e.contains("smallest quota"), "{e}");
    }

    #[test]
    fn fingerprint_follows_the_prefixes_only() {
        let a = Rules::new(vec![rule("/a"), rule("/b")]).unwrap();
        let mut b2 = rule("/b");
        b2.quota = Some(1);
        let b = Rules::new(vec![b2, rule("/a/")]).unwrap();
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), 0);
        assert_eq!(Rules::default().fingerprint(), 0);
        let c = Rules::new(vec![rule("/a"), rule("/c")]).unwrap();
        assert_ne!(a.fingerprint(), c.fingerprint());
    }
}
