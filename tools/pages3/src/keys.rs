//! Keys and paths: how a bucket and a key map to a logical path (and which keys are refused),
//! and the encodings of listings (`encoding-type=url`, continuation tokens, ETags).

use s3s::{dto::ETag, S3Error, S3ErrorCode, S3Result};

use super::{checks, errors::invalid, valid_bucket};

/// Decodes `%XX` escapes (invalid escapes are kept as they are).
pub(super) fn percent_decode(s: &[u8]) -> Vec<u8> {
    percent_encoding::percent_decode(s).collect()
}

/// What `encoding-type=url` escapes: everything but unreserved characters and `/`.
const URL_ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b'/');

/// Whether a key segment stays clear of `.`, `..` and NUL however many times it is
/// percent-decoded (a store or a later hop might decode it again).
pub(super) fn segment_is_safe(seg: &[u8]) -> bool {
    let mut cur = seg.to_vec();
    for _ in 0..8 {
        if cur.contains(&0) {
            return false;
        }
        if cur
            .split(|&b| b == b'/' || b == b'\\')
            .any(|p| p == b"." || p == b"..")
        {
            return false;
        }
        let next = percent_decode(&cur);
        if next == cur {
            return true;
        }
        cur = next;
    }
    // Still decoding after that many rounds: refuse rather than guess.
    false
}

/// What a key names.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum KeyPath {
    /// An object: its logical path.
    Object(String),
    /// A key ending in `/` (a "directory marker"): the logical path of its directory (no
    /// trailing `/`). No object in pagestore; the gateway remembers markers put (see
    /// [`crate::Markers`]).
    Marker(String),
}

/// The logical path of `key` in `bucket`, or the reason it is refused.
pub(super) fn key_path(bucket: &str, key: &str) -> S3Result<KeyPath> {
    if !valid_bucket(bucket) {
        return Err(S3Error::with_message(
            S3ErrorCode::InvalidBucketName,
            format!("{bucket:?} is not a bucket name"),
        ));
    }
    if key.is_empty() {
        return Err(invalid("the key is empty".into()));
    }
    checks::check_key_len(key)?;
    check_segments(key)?;
    let (body, marker) = match key.strip_suffix('/') {
        Some(b) => (b, true),
        None => (key, false),
    };
    if body.is_empty() || body.split('/').any(str::is_empty) {
        return Err(invalid(format!(
            "key {key:?} has an empty path segment (pagestore keys are file paths)"
        )));
    }
    if marker {
        return Ok(KeyPath::Marker(format!("/{bucket}/{body}")));
    }
    Ok(KeyPath::Object(format!("/{bucket}/{key}")))
}

/// Refuses `.` and `..` segments (plain or percent-encoded) and NUL anywhere in `s`.
pub(super) fn check_segments(s: &str) -> S3Result<()> {
    if !s.split('/').all(|seg| segment_is_safe(seg.as_bytes())) {
        return Err(invalid(format!(
            "{s:?} has a . or .. segment (possibly percent-encoded) or a NUL byte; such keys are \
             refused"
        )));
    }
    Ok(())
}

/// `%XX`-encodes everything except unreserved characters and `/` (listing `encoding-type=url`).
pub(super) fn url_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, URL_ESCAPED).to_string()
}

/// Continuation tokens: the last key of the page, hex-encoded behind a version letter.
pub(super) fn encode_token(last: &str) -> String {
    let mut t = String::with_capacity(1 + 2 * last.len());
    t.push('k');
    for b in last.as_bytes() {
        t.push_str(&format!("{b:02x}"));
    }
    t
}

pub(super) fn decode_token(t: &str) -> S3Result<String> {
    let bad = || invalid("the continuation token is not one this gateway issued".into());
    let hex = t.strip_prefix('k').ok_or_else(bad)?;
    if hex.len() % 2 != 0 {
        return Err(bad());
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("zz"), 16).map_err(|_| bad()))
        .collect::<S3Result<Vec<u8>>>()?;
    String::from_utf8(bytes).map_err(|_| bad())
}

/// An ETag from a version tag (visible ASCII without quotes, as a header value needs).
pub(super) fn etag(version: &str) -> ETag {
    ETag::Strong(
        version
            .chars()
            .map(|c| {
                if c.is_ascii_graphic() && c != '"' {
                    c
                } else {
                    '_'
                }
            })
            .collect(),
    )
}

/// The `versionId` of a request. Buckets served here are never versioned, so an object's only
/// version is S3's `null` one (what ListObjectVersions lists): `null` names the object itself;
/// any other id is 400 InvalidArgument, as S3 answers for an unversioned bucket (never the
/// current object under another version's name).
pub(super) fn check_version_id(version_id: Option<&str>) -> s3s::S3Result<()> {
    match version_id {
        None | Some("null") => Ok(()),
        Some(other) => Err(s3s::S3Error::with_message(
            s3s::S3ErrorCode::InvalidArgument,
            format!(
                "Invalid version id specified: {other:?} (buckets served by pages3 are not \
                 versioned; an object's only version is \"null\")"
            ),
        )),
    }
}
