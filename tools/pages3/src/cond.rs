//! Conditional requests as S3 evaluates them: `If-Match`, `If-None-Match`, `If-Modified-Since`
//! and `If-Unmodified-Since` on reads (412 Precondition Failed, 304 Not Modified), and the
//! write modes that `If-None-Match: *` and `If-Match` ask of a write.

use std::time::{SystemTime, UNIX_EPOCH};

use hyper::{
    header::{self, HeaderValue},
    HeaderMap,
};
use object_store::{PutMode, UpdateVersion};
use s3s::{
    dto::{ETag, ETagCondition, Timestamp},
    S3Error, S3ErrorCode, S3Result,
};

/// The ETags that name an object's current version: the one the gateway reports, and the
/// store's own tag when that differs (a multipart upload's `md5-N` form).
#[derive(Clone, Debug)]
pub(super) struct Tags {
    pub(super) reported: ETag,
    pub(super) store: ETag,
}

impl Tags {
    fn matches(&self, cond: &ETagCondition) -> bool {
        match cond {
            ETagCondition::Any => true,
            ETagCondition::ETag(want) => {
                let want = want.value().trim_matches('"');
                want == self.reported.value() || want == self.store.value()
            }
        }
    }
}

/// The conditions of a GetObject, HeadObject or of a copy's source.
#[derive(Default)]
pub(super) struct ReadConditions<'a> {
    pub(super) if_match: Option<&'a ETagCondition>,
    pub(super) if_none_match: Option<&'a ETagCondition>,
    pub(super) if_modified_since: Option<&'a Timestamp>,
    pub(super) if_unmodified_since: Option<&'a Timestamp>,
}

/// Whole seconds since the epoch (HTTP dates have no finer resolution).
fn secs(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

fn ts_secs(t: &Timestamp) -> i64 {
    time::OffsetDateTime::from(t.clone()).unix_timestamp()
}

pub(super) fn precondition_failed(msg: &str) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::PreconditionFailed,
        format!("At least one of the pre-conditions you specified did not hold ({msg})"),
    )
}

/// What the conditions make of a read of an object with `tags`, last modified at `modified`:
/// `Ok` to serve it, or 412 / 304 in S3's order. `If-Match` is evaluated first (and, when it
/// holds, `If-Unmodified-Since` is not); then `If-None-Match` (and, when present,
/// `If-Modified-Since` is not). A 304 carries the ETag and Last-Modified headers.
pub(super) fn check_read(
    c: &ReadConditions<'_>,
    tags: &Tags,
    modified: SystemTime,
) -> S3Result<()> {
    let m = secs(modified);
    match (c.if_match, c.if_unmodified_since) {
        (Some(cond), _) if !tags.matches(cond) => {
            return Err(precondition_failed("If-Match: the object has another ETag"))
        }
        (None, Some(t)) if m > ts_secs(t) => {
            return Err(precondition_failed(
                "If-Unmodified-Since: the object was modified since",
            ))
        }
        _ => {}
    }
    let not_modified = match (c.if_none_match, c.if_modified_since) {
        (Some(cond), _) => tags.matches(cond),
        (None, Some(t)) => m <= ts_secs(t),
        (None, None) => false,
    };
    if not_modified {
        let mut e = S3Error::new(S3ErrorCode::NotModified);
        let mut h = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(&format!("\"{}\"", tags.reported.value())) {
            h.insert(header::ETAG, v);
        }
        let mut date = Vec::new();
        if Timestamp::from(modified)
            .format(s3s::dto::TimestampFormat::HttpDate, &mut date)
            .is_ok()
        {
            if let Ok(v) = HeaderValue::from_bytes(&date) {
                h.insert(header::LAST_MODIFIED, v);
            }
        }
        e.set_headers(h);
        return Err(e);
    }
    Ok(())
}

/// The conditions of a copy's source (`x-amz-copy-source-if-*`): as a read's, but every
/// failure is a 412 (S3 answers no 304 to a copy).
pub(super) fn check_copy_source(
    c: &ReadConditions<'_>,
    tags: &Tags,
    modified: SystemTime,
) -> S3Result<()> {
    check_read(c, tags, modified).map_err(|e| {
        if *e.code() == S3ErrorCode::NotModified {
            precondition_failed("x-amz-copy-source-if-none-match / -if-modified-since")
        } else {
            e
        }
    })
}

/// What a write's conditions ask of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum WriteCondition {
    /// No condition: replace whatever is there.
    None,
    /// `If-None-Match: *`: only if no object is there.
    Create,
    /// `If-Match`: only if the object has this ETag (`*`: any version).
    Match(ETagCondition),
}

impl WriteCondition {
    /// The condition of a PutObject or CompleteMultipartUpload. `If-None-Match` with an ETag
    /// (rather than `*`) is refused with 501, as S3 does; both headers together with 400.
    pub(super) fn of(
        if_match: Option<&ETagCondition>,
        if_none_match: Option<&ETagCondition>,
    ) -> S3Result<WriteCondition> {
        match (if_match, if_none_match) {
            (None, None) => Ok(WriteCondition::None),
            (None, Some(ETagCondition::Any)) => Ok(WriteCondition::Create),
            (None, Some(ETagCondition::ETag(_))) => Err(S3Error::with_message(
                S3ErrorCode::NotImplemented,
                "If-None-Match on a write: only If-None-Match: * (create only) is supported",
            )),
            (Some(m), None) => Ok(WriteCondition::Match(m.clone())),
            (Some(_), Some(_)) => Err(S3Error::with_message(
                S3ErrorCode::InvalidArgument,
                "If-Match and If-None-Match cannot be combined on a write",
            )),
        }
    }

    /// The store's write mode, given the object now at the path: `current` is its store
    /// version and its [`Tags`] (`None`: nothing there). A condition that already fails is
    /// 412 (or 404 for If-Match on a missing key, as S3 answers).
    pub(super) fn mode(&self, current: Option<(&str, &Tags)>) -> S3Result<PutMode> {
        match (self, current) {
            (WriteCondition::None, _) => Ok(PutMode::Overwrite),
            (WriteCondition::Create, Some(_)) => Err(precondition_failed(
                "If-None-Match: *: an object of this key exists",
            )),
            (WriteCondition::Create, None) => Ok(PutMode::Create),
            (WriteCondition::Match(_), None) => Err(S3Error::with_message(
                S3ErrorCode::NoSuchKey,
                "If-Match: the specified key does not exist",
            )),
            (WriteCondition::Match(cond), Some((version, tags))) => {
                if !tags.matches(cond) {
                    return Err(precondition_failed("If-Match: the object has another ETag"));
                }
                Ok(PutMode::Update(UpdateVersion {
                    e_tag: Some(format!("\"{version}\"")),
                    version: None,
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    fn tags(v: &str) -> Tags {
        Tags {
            reported: ETag::Strong(v.into()),
            store: ETag::Strong(v.into()),
        }
    }

    fn at(s: u64) -> Timestamp {
        Timestamp::from(UNIX_EPOCH + Duration::from_secs(s))
    }

    fn code(r: S3Result<()>) -> Option<S3ErrorCode> {
        r.err().map(|e| e.code().clone())
    }

    #[test]
    fn read_conditions_follow_s3_precedence() {
        let t = tags("abc");
        let mtime = UNIX_EPOCH + Duration::from_millis(1_000_500);
        let yes = ETagCondition::ETag(ETag::Strong("abc".into()));
        let no = ETagCondition::ETag(ETag::Strong("xyz".into()));
        let (before, same, after) = (at(999), at(1000), at(1001));
        let c = |im, inm, ims, ius| ReadConditions {
            if_match: im,
            if_none_match: inm,
            if_modified_since: ims,
            if_unmodified_since: ius,
        };
        assert_eq!(
            code(check_read(&c(None, None, None, None), &t, mtime)),
            None
        );
        assert_eq!(
            code(check_read(&c(Some(&no), None, None, None), &t, mtime)),
            Some(S3ErrorCode::PreconditionFailed)
        );
        assert_eq!(
            code(check_read(
                &c(Some(&ETagCondition::Any), None, None, None),
                &t,
                mtime
            )),
            None
        );
        // If-Match holds: If-Unmodified-Since is not evaluated.
        assert_eq!(
            code(check_read(
                &c(Some(&yes), None, None, Some(&before)),
                &t,
                mtime
            )),
            None
        );
        assert_eq!(
            code(check_read(&c(None, None, None, Some(&before)), &t, mtime)),
            Some(S3ErrorCode::PreconditionFailed)
        );
        assert_eq!(
            code(check_read(&c(None, None, None, Some(&same)), &t, mtime)),
            None
        );
        assert_eq!(
            code(check_read(&c(None, Some(&yes), None, None), &t, mtime)),
            Some(S3ErrorCode::NotModified)
        );
        assert_eq!(
            code(check_read(
                &c(None, Some(&ETagCondition::Any), None, None),
                &t,
                mtime
            )),
            Some(S3ErrorCode::NotModified)
        );
        // If-None-Match does not match: If-Modified-Since is not evaluated.
        assert_eq!(
            code(check_read(
                &c(None, Some(&no), Some(&after), None),
                &t,
                mtime
            )),
            None
        );
        assert_eq!(
            code(check_read(&c(None, None, Some(&same), None), &t, mtime)),
            Some(S3ErrorCode::NotModified)
        );
        assert_eq!(
            code(check_read(&c(None, None, Some(&before), None), &t, mtime)),
            None
        );
        // 412 wins over 304.
        assert_eq!(
            code(check_read(&c(Some(&no), Some(&yes), None, None), &t, mtime)),
            Some(S3ErrorCode::PreconditionFailed)
        );
        assert_eq!(
            code(check_copy_source(
                &c(None, Some(&yes), None, None),
                &t,
                mtime
            )),
            Some(S3ErrorCode::PreconditionFailed)
        );
    }

    #[test]
    fn write_conditions_become_store_modes() {
        let t = tags("v1");
        let any = ETagCondition::Any;
        let v1 = ETagCondition::ETag(ETag::Strong("v1".into()));
        let v2 = ETagCondition::ETag(ETag::Strong("v2".into()));
        assert_eq!(
            WriteCondition::of(None, None).unwrap(),
            WriteCondition::None
        );
        let create = WriteCondition::of(None, Some(&any)).unwrap();
        assert_eq!(create.mode(None).unwrap(), PutMode::Create);
        assert_eq!(
            *create.mode(Some(("v1", &t))).unwrap_err().code(),
            S3ErrorCode::PreconditionFailed
        );
        assert_eq!(
            *WriteCondition::of(None, Some(&v1)).unwrap_err().code(),
            S3ErrorCode::NotImplemented
        );
        assert!(WriteCondition::of(Some(&v1), Some(&any)).is_err());
        let upd = WriteCondition::of(Some(&v1), None).unwrap();
        assert!(
            matches!(upd.mode(Some(("v1", &t))).unwrap(), PutMode::Update(u) if u.e_tag.as_deref() == Some("\"v1\""))
        );
        assert_eq!(*upd.mode(None).unwrap_err().code(), S3ErrorCode::NoSuchKey);
        let other = WriteCondition::of(Some(&v2), None).unwrap();
        assert_eq!(
            *other.mode(Some(("v1", &t))).unwrap_err().code(),
            S3ErrorCode::PreconditionFailed
        );
    }
}
