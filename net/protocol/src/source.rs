//! The under storage as a node sees it: the [`Source`] seam, written in wire types, that a
//! node's shards load misses through. `pagestore-mounts` implements it over the mount table;
//! tests implement it with fault injection. Runtime-free: implementations return `Send` futures
//! that the node runs on a runtime of its choosing.

use std::{future::Future, ops::Range, pin::Pin};

use bytes::Bytes;

use crate::frame::{DirEntry, ErrorCode, FileRef, MountEntry, PathKind};

/// Why the under storage could not answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceError {
    /// The category sent to clients (`NotFound`, `Changed`, `BadRequest`, `Io`, `Unavailable`).
    pub code: ErrorCode,
    /// What went wrong, for people.
    pub message: String,
}

impl SourceError {
    /// An error of category `code`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> SourceError {
        SourceError {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for SourceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

impl std::error::Error for SourceError {}

/// A `Send` future of the under storage.
pub type SourceFuture<T> = Pin<Box<dyn Future<Output = Result<T, SourceError>> + Send>>;

/// The under storage as a shard sees it. Implementations must be cheap to call from any thread;
/// the futures they return run on the node's tokio runtime.
pub trait Source: Send + Sync + 'static {
    /// Reads `range` of `file` at exactly `file.version_tag` (fewer bytes only at the end of the
    /// object); `Changed` if the object now has another version.
    fn read(&self, file: &FileRef, range: Range<u64>) -> SourceFuture<Bytes>;
    /// What `path` names.
    fn stat(&self, path: &str) -> SourceFuture<PathKind>;
    /// Every entry of directory `path`, sorted by name.
    fn list(&self, path: &str) -> SourceFuture<Vec<DirEntry>>;
    /// The head of directory `path`'s listing: its first entries in name order (at most
    /// `max`, at least one), the same as [`Source::list`] starts with, and whether more may
    /// follow. `None` (the default) where the source cannot give it sooner than the whole
    /// listing; a node then lists the whole directory before it answers the first page.
    fn list_head(&self, path: &str, max: usize) -> Option<SourceFuture<(Vec<DirEntry>, bool)>> {
        let _ = (path, max);
        None
    }
    /// Work to do before a stat of `path` is answered (from a shard's metadata cache or from
    /// the source): a node whose answers about `path` may miss what other nodes hold (the
    /// records of files written through the cluster) takes theirs first. `None` (the default)
    /// when there is nothing to do. The future ends `Ok` whether or not it could take them.
    fn catch_up(&self, path: &str) -> Option<SourceFuture<()>> {
        let _ = path;
        None
    }
    /// Work to do before a listing of directory `dir` is answered, as [`Source::catch_up`]
    /// before a stat: a node that may miss what other nodes hold of the directory's entries
    /// takes theirs first. `None` (the default) when there is nothing to do.
    fn catch_up_listing(&self, dir: &str) -> Option<SourceFuture<()>> {
        let _ = dir;
        None
    }
    /// The mount table, credentials removed.
    fn mounts(&self) -> Vec<MountEntry>;
    /// The whole of page `page` of `file` (at exactly `file.version_tag`) from the ring member
    /// that owns it, peer to peer: how a hot page's replica copies it without a store read.
    /// The default has no peers (`Unavailable`); the loader then reads the store instead.
    fn read_from_owner(&self, file: &FileRef, page: u64) -> SourceFuture<Bytes> {
        let _ = (file, page);
        Box::pin(async {
            Err(SourceError::new(
                ErrorCode::Unavailable,
                "this node has no client of its peers",
            ))
        })
    }
}

/// The version number pages loaded at `version_tag` are stored with (`hash64` of the tag).
pub fn page_version(version_tag: &str) -> u64 {
    crate::ring::hash64(version_tag.as_bytes())
}

/// The query parameter of a mount URL that prices its store's egress, in US dollars per TB
/// (10^12 bytes) read.
pub const EGRESS_PRICE_PARAM: &str = "egress_usd_per_tb";

/// The egress price a mount URL names (`...?egress_usd_per_tb=90`): `Ok(None)` when it names
/// none, an error when the value is not a plain decimal number of at least 0 (or the parameter
/// is given twice). The mount table checks this when it is built; nodes read the price with it.
pub fn egress_price(url: &str) -> Result<Option<f64>, String> {
    let Some((_, query)) = url.split_once('?') else {
        return Ok(None);
    };
    let query = query.split('#').next().unwrap_or_default();
    let mut price = None;
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k != EGRESS_PRICE_PARAM {
            continue;
        }
        if price.is_some() {
            return Err(format!("{EGRESS_PRICE_PARAM} is given twice"));
        }
        let plain = !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit() || b == b'.');
        let p = v
            .parse::<f64>()
            .ok()
            .filter(|p| plain && p.is_finite() && *p >= 0.0)
            .ok_or_else(|| {
                format!("{EGRESS_PRICE_PARAM}={v} is not a price (a decimal number of at least 0)")
            })?;
        price = Some(p);
    }
    Ok(price)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_prices_are_plain_numbers_in_the_query() {
        assert_eq!(egress_price("s3://b/p"), Ok(None));
        assert_eq!(egress_price("s3://b/p?region=x"), Ok(None));
        assert_eq!(
            egress_price("s3://b/p?egress_usd_per_tb=90"),
            Ok(Some(90.0))
        );
        assert_eq!(
            egress_price("file:///d?emulate_mbps=25&egress_usd_per_tb=0.5#frag"),
            Ok(Some(0.5))
        );
        assert_eq!(egress_price("s3://b?egress_usd_per_tb=0"), Ok(Some(0.0)));
        for bad in ["-1", "", "1e3", "nan", "inf", "1,5", "1%2E5", "12abc"] {
            let url = format!("s3://b/p?egress_usd_per_tb={bad}");
            let e = egress_price(&url).unwrap_err();
            assert!(e.contains("egress_usd_per_tb"), "{bad}: {e}");
        }
        assert!(egress_price("s3://b?egress_usd_per_tb=1&egress_usd_per_tb=2").is_err());
        // Another parameter whose name only ends the same is not the price.
        assert_eq!(egress_price("s3://b?x_egress_usd_per_tb=5"), Ok(None));
    }
}
